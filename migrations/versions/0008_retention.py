"""The retention pass's index: ended jobs not purged yet, by the time they ended

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-21 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNPURGED = sa.text("purged_at IS NULL")


def upgrade() -> None:
    # Partial: purged rows stay for good, and the pass (core.retention.expired) must not
    # walk past them, oldest first, at every reconcile.
    op.create_index(
        "ix_jobs_unpurged_finished",
        "jobs",
        ["finished_at"],
        unique=False,
        sqlite_where=UNPURGED,
        postgresql_where=UNPURGED,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_unpurged_finished", table_name="jobs")

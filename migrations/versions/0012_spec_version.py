"""jobs.spec_version: which JobSpec the code that wrote a job's row had, so that a worker
that cannot read the row can tell version skew from a bad spec

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 02:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both databases (SQLite has both since 3.35): a batch would copy the
# jobs table on SQLite, and dropping the old copy would cascade to every row naming a job.


def upgrade() -> None:
    op.add_column("jobs", sa.Column("spec_version", sa.String(length=12), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "spec_version")

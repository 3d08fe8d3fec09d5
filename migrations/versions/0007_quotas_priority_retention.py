"""Sharing the workers: a job's priority, per-owner quota overrides, and the time the
retention policy purged an ended job

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-20 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        # Jobs queued before priorities existed are all "normal" (0).
        batch_op.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("purged_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_jobs_owner_status", ["owner", "status"], unique=False)
    op.create_table(
        "quotas",
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("limits", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("owner"),
    )


def downgrade() -> None:
    op.drop_table("quotas")
    op.drop_index("ix_jobs_owner_status", table_name="jobs")
    # Plain DROP COLUMN (SQLite 3.35+): a batch copy of `jobs` on SQLite would drop the old
    # table, and with it, by ON DELETE CASCADE, every job's epochs, checkpoint and models.
    op.execute("ALTER TABLE jobs DROP COLUMN purged_at")
    op.execute("ALTER TABLE jobs DROP COLUMN priority")

"""stop_requested_attempt: the attempt whose worker was asked to stop, so that its loss
before it hands the job back is a preemption, not a restart

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-10 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        # Existing jobs were never asked to stop: NULL.
        batch_op.add_column(sa.Column("stop_requested_attempt", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("stop_requested_attempt")

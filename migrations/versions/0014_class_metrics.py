"""epoch_metrics.class_metrics: each epoch's confusion matrix, per-class accuracy and top-5
accuracy on the test split, with the class names (JSON; null for epochs stored before)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-08 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both databases, as 0012 does: no batch copy of the table.


def upgrade() -> None:
    op.add_column("epoch_metrics", sa.Column("class_metrics", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("epoch_metrics", "class_metrics")

"""datasets: what a photo upload was made of (class names, per-split counts, per-channel
mean and std, the preprocessing, the files skipped, thumbnails); NULL in older rows

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-08 02:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_COLUMNS = ("classes", "class_counts", "mean", "std", "preprocessing", "skipped", "thumbnails")


# Plain ALTER TABLE on both databases (SQLite has both since 3.35), as 0012.


def upgrade() -> None:
    for name in JSON_COLUMNS:
        op.add_column("datasets", sa.Column(name, sa.JSON(), nullable=True))
    op.add_column("datasets", sa.Column("holdout_count", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("datasets", "holdout_count")
    for name in reversed(JSON_COLUMNS):
        op.drop_column("datasets", name)

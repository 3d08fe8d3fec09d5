"""artifacts: one row per (job_id, format), for the formats a job's model is exported in
(TorchScript, torch.export's .pt2, ONNX); `kind` becomes `format`

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-11 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Every stored artifact is a TorchScript model, and its `kind` says so already.
    _rekey(old="kind", new="format", key=["job_id", "format"])


def downgrade() -> None:
    # The schema before this one holds TorchScript alone: a job whose only models are other
    # formats would stay `succeeded` with nothing to download. Refuse, naming them.
    stranded = op.get_bind().execute(
        sa.text(
            "SELECT DISTINCT job_id FROM artifacts WHERE job_id NOT IN "
            "(SELECT job_id FROM artifacts WHERE format = 'torchscript')"
        )
    )
    jobs = [row[0] for row in stranded]
    if jobs:
        raise RuntimeError(
            f"cannot downgrade below 0006: {len(jobs)} job(s) offer no TorchScript model and "
            f"would be left with none ({', '.join(jobs[:10])}{', ...' if len(jobs) > 10 else ''}"
            "); delete those jobs' artifacts first, or stay on this version"
        )
    op.execute("DELETE FROM artifacts WHERE format <> 'torchscript'")
    _rekey(old="format", new="kind", key=["job_id"])


def _rekey(old: str, new: str, key: list[str]) -> None:
    """Column `old` renamed `new`, and the primary key on `key`."""
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column("artifacts", old, new_column_name=new)
        op.drop_constraint("artifacts_pkey", "artifacts", type_="primary")
        op.create_primary_key("artifacts_pkey", "artifacts", key)
        return
    # SQLite cannot alter a primary key: batch copies the table into one created from this
    # definition (the current columns, with the new key), then renames the column.
    source = sa.Table(
        "artifacts",
        sa.MetaData(),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column(old, sa.String(length=32), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint(*[old if c == new else c for c in key]),
    )
    with op.batch_alter_table("artifacts", copy_from=source, recreate="always") as batch_op:
        batch_op.alter_column(old, new_column_name=new)

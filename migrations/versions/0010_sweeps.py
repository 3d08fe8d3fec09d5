"""sweeps, and the jobs that are their trials

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 04:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("quota_owner", sa.String(length=64), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("trials_created", sa.Integer(), nullable=False),
        sa.Column("waiting", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner", "idempotency_key", name="uq_sweeps_owner_idempotency_key"),
    )
    op.create_index("ix_sweeps_owner_created", "sweeps", ["owner", "created_at"])
    op.create_index("ix_sweeps_status", "sweeps", ["status"])
    # Plain ADD COLUMNs: a batch copy of jobs on SQLite would cascade-delete its children.
    op.add_column("jobs", sa.Column("sweep_id", sa.String(length=36), nullable=True))
    op.add_column("jobs", sa.Column("trial_number", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("trial_params", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("trial_attrs", sa.JSON(), nullable=True))
    # One job per trial number: two deciders racing for a trial cannot both make it.
    op.create_index("uq_jobs_sweep_trial", "jobs", ["sweep_id", "trial_number"], unique=True)


def downgrade() -> None:
    # The schema before this one has no sweeps and no `pruned` status: dropping them would
    # forget which jobs were whose trials and leave jobs in a status that code cannot read.
    # Refuse, naming them.
    bind = op.get_bind()
    sweeps = [row[0] for row in bind.execute(sa.text("SELECT id FROM sweeps"))]
    pruned = [
        row[0] for row in bind.execute(sa.text("SELECT id FROM jobs WHERE status = 'pruned'"))
    ]
    if sweeps or pruned:
        named = [*sweeps, *pruned]
        shown = ", ".join(named[:10]) + (", ..." if len(named) > 10 else "")
        raise RuntimeError(
            f"cannot downgrade below 0010: {len(sweeps)} sweep(s) and {len(pruned)} pruned "
            f"job(s) would be lost or unreadable ({shown}); stay on this version, or remove "
            "them (the pruned jobs with DELETE /jobs/{id}) and the sweeps' rows first"
        )
    op.drop_index("uq_jobs_sweep_trial", table_name="jobs")
    for column in ("trial_attrs", "trial_params", "trial_number", "sweep_id"):
        op.drop_column("jobs", column)
    op.drop_index("ix_sweeps_status", table_name="sweeps")
    op.drop_index("ix_sweeps_owner_created", table_name="sweeps")
    op.drop_table("sweeps")

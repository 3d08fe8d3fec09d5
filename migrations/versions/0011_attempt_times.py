"""attempt_times: each attempt's time on a worker, kept apart from its job's row, so that
deleting a job gives back none of the training hours its owner's quota counts

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 12:30:00.000000
"""

import datetime as dt
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What the quota counted before: each job's latest attempt. Its end is the job's requeue
# (enqueued_at, once past its start) or its end (finished_at); while it runs, none. Only the
# attempts that may still count are copied (core.quotas.KEEP_ATTEMPT_TIMES_S).
BACKFILL = """
INSERT INTO attempt_times (owner, job_id, attempt, started_at, ended_at)
SELECT owner, id, attempt, started_at,
       CASE
         WHEN status = 'running' THEN NULL
         WHEN enqueued_at IS NOT NULL AND enqueued_at > started_at THEN enqueued_at
         ELSE COALESCE(finished_at, started_at)
       END
FROM jobs
WHERE started_at IS NOT NULL AND attempt > 0
  AND (status = 'running' OR finished_at >= :since OR enqueued_at >= :since)
"""
KEEP_S = 2 * 24 * 3600


def upgrade() -> None:
    op.create_table(
        "attempt_times",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_attempt_times_owner_ended", "attempt_times", ["owner", "ended_at"])
    op.create_index("ix_attempt_times_job_ended", "attempt_times", ["job_id", "ended_at"])
    op.create_index("ix_attempt_times_ended", "attempt_times", ["ended_at"])
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=KEEP_S)
    backfill = sa.text(BACKFILL).bindparams(
        sa.bindparam("since", since, type_=sa.DateTime(timezone=True))
    )
    op.get_bind().execute(backfill)


def downgrade() -> None:
    # The schema before this one counts hours from the job rows alone: a deleted job's
    # time is forgotten with this table.
    op.drop_index("ix_attempt_times_ended", table_name="attempt_times")
    op.drop_index("ix_attempt_times_job_ended", table_name="attempt_times")
    op.drop_index("ix_attempt_times_owner_ended", table_name="attempt_times")
    op.drop_table("attempt_times")

"""The sweep row and the reads of its trials (the jobs that name it)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from enum import StrEnum

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, load_only

from core.db import EpochMetric, Job, Sweep, db_now
from core.spec import JobStatus
from core.store.jobs import newest_first
from core.webhooks.outbox import record_sweep_end


class SweepStatus(StrEnum):
    running = "running"  # trials are queued or running, or more will be asked for
    succeeded = "succeeded"  # the budget is spent and at least one trial completed
    failed = "failed"  # the budget is spent and no trial completed
    canceled = "canceled"

    @property
    def ended(self) -> bool:
        return self is not SweepStatus.running


IN_FLIGHT = (JobStatus.queued, JobStatus.running)


def get_sweep(s: Session, *, sweep_id: str) -> Sweep | None:
    return s.get(Sweep, sweep_id)


def lock_sweep(s: Session, *, sweep_id: str) -> Sweep | None:
    """The sweep's row, held until the commit: one decider at a time asks for its trials and
    judges them. On SQLite the transaction holds the one write lock already."""
    return s.scalars(
        select(Sweep)
        .where(Sweep.id == sweep_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).first()


def list_sweeps(
    s: Session,
    *,
    owner: str | None,
    all_owners: bool,
    before: tuple[str, str] | None,
    limit: int,
    id_prefix: str | None = None,
) -> Sequence[Sweep]:
    """Newest first; `before` is the (created_at iso, id) of the previous page's last;
    `id_prefix`, the start of the ids wanted."""
    q = select(Sweep)
    if not all_owners:
        q = q.where(Sweep.owner == owner)
    if id_prefix is not None:
        q = q.where(Sweep.id.startswith(id_prefix, autoescape=True))
    return s.scalars(newest_first(q, Sweep, before, limit)).all()


def running_sweep_ids(s: Session) -> list[str]:
    return list(s.scalars(select(Sweep.id).where(Sweep.status == SweepStatus.running)))


def count_running_sweeps(s: Session, *, owner: str) -> int:
    q = select(func.count()).select_from(Sweep)
    return int(s.scalar(q.where(Sweep.owner == owner, Sweep.status == SweepStatus.running)) or 0)


# What deciding and reporting read of a trial: not its spec, result or run record.
_TRIAL_COLUMNS = (
    Job.id, Job.owner, Job.status, Job.sweep_id, Job.trial_number, Job.trial_params,
    Job.trial_attrs, Job.error_code, Job.error_message,
)  # fmt: skip


def trials_of(s: Session, *, sweep_id: str) -> Sequence[Job]:
    """The sweep's trials, by number (the columns a decision or a report reads)."""
    return s.scalars(
        select(Job)
        .options(load_only(*_TRIAL_COLUMNS))
        .where(Job.sweep_id == sweep_id)
        .order_by(Job.trial_number)
    ).all()


def epochs_of(s: Session, *, sweep_id: str) -> dict[str, list[EpochMetric]]:
    """Each trial's epoch records, in order, by job id: one read for the whole sweep."""
    rows = s.scalars(
        select(EpochMetric)
        .join(Job, Job.id == EpochMetric.job_id)
        .where(Job.sweep_id == sweep_id)
        .order_by(EpochMetric.job_id, EpochMetric.epoch)
    )
    out: dict[str, list[EpochMetric]] = defaultdict(list)
    for row in rows:
        out[row.job_id].append(row)
    return out


def end_sweep(s: Session, *, sweep_id: str, status: SweepStatus) -> bool:
    """running -> `status`; False if it had ended already. The sweep's webhook event is
    written (core.webhooks.outbox) in the same transaction, only by the call that ended it."""
    res = s.execute(
        update(Sweep)
        .where(Sweep.id == sweep_id, Sweep.status == SweepStatus.running)
        .values(status=status, finished_at=db_now(), waiting=None)
    )
    if not res.rowcount:  # type: ignore[attr-defined]
        return False
    record_sweep_end(s, sweep_id=sweep_id)
    return True


def set_trial_attrs(s: Session, *, job_id: str, attrs: dict[str, object]) -> None:
    s.execute(update(Job).where(Job.id == job_id).values(trial_attrs=attrs))

"""One attempt at a job: the record every part of a run reads, and the claim that numbers it."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from redis import Redis
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import Database, Job
from core.spec import JobStatus
from core.store import claim_job, epoch_metrics, get_job, latest_checkpoint
from core.train import EpochMetrics
from core.train.device import device_name, resolve_device
from worker.retry import retry_write

log = logging.getLogger("trainq.worker")
T = TypeVar("T")


@dataclass(frozen=True)
class Attempt:
    """A queue entry as this worker runs it. `number` is 0 until the claim gives the attempt
    its number; from then on the job row takes only this attempt's writes."""

    job_id: str
    queue_entry: str
    raw_spec: Any  # as the entry carried it; a job row's own spec wins (worker.admission)
    owner: str | None
    via: str | None  # core.queue.VIA_API: the API enqueued it before committing its row
    worker: str
    settings: Settings
    db: Database
    r: Redis
    stop_asked: Callable[[], bool]  # the worker was asked to stop (worker.preemption)
    number: int = 0

    def write(self, write: Callable[[Session], T]) -> T:
        """A write of this attempt, retried through a database blip for up to the heartbeat
        timeout (worker.retry)."""
        what = f"job {self.job_id}: a database write of attempt {self.number}"
        return retry_write(write, self.db, self.settings.heartbeat_timeout_s, what)

    def row(self) -> tuple[int, JobStatus] | None:
        return job_row(self.db, self.job_id)


@dataclass(frozen=True)
class Claim:
    """The job row as the claim left it, and where its training resumes."""

    job: Job
    device: str
    checkpoint: bytes | None  # the last one an earlier attempt saved
    start_step: int
    history: list[EpochMetrics]  # the epochs earlier attempts finished


def claim(a: Attempt) -> Claim | None:
    """The job, queued under this entry, taken as running under a new attempt number; None
    if it is not (ended, running elsewhere, or on the queue under another entry)."""
    device = device_name(resolve_device("auto"))
    with a.db.writer() as s:
        job = claim_job(
            s, job_id=a.job_id, worker=a.worker, device=device, queue_entry=a.queue_entry
        )
        checkpoint = latest_checkpoint(s, job_id=a.job_id) if job else None
        if job is not None:
            if checkpoint is None:
                return Claim(job, device, None, 0, [])
            return Claim(job, device, checkpoint.data, checkpoint.step, _history(s, a.job_id))
    log.info(
        "job %s is not queued under entry %s (ended, running elsewhere, or on the queue "
        "under another entry); not running it",
        a.job_id,
        a.queue_entry,
    )
    return None


def _history(s: Session, job_id: str) -> list[EpochMetrics]:
    """The epochs the job's earlier attempts finished (stored with their checkpoints)."""
    names = [f.name for f in dataclasses.fields(EpochMetrics)]
    return [
        EpochMetrics(**{n: getattr(row, n) for n in names})
        for row in epoch_metrics(s, job_id=job_id)
    ]


def job_row(db: Database, job_id: str) -> tuple[int, JobStatus] | None:
    """The job row's attempt and status now: what proves an attempt's ownership where the
    stream's fence went missing (core.stream.Publisher)."""
    with db.reader() as s:
        job = get_job(s, job_id=job_id)
        return (job.attempt, JobStatus(job.status)) if job else None

"""One attempt at a job: the record every part of a run reads, the claim that numbers it,
and the one way it ends (`finish`). See docs/jobs.md."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import Database, Job
from core.errors import TrainingStopped, TrainqError
from core.queue import enqueue_or_leave
from core.spec import JobStatus
from core.store import claim_job, end_job, epoch_metrics, get_job, latest_checkpoint
from core.stream import publish_status
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


SUPERSEDED = "superseded"  # an outcome, not a status: another attempt owns the job now


@dataclass(frozen=True)
class End:
    """How an attempt ends, as data for `finish`: the guarded write that records it, what
    the job's stream is told, and, for a job handed back, the entry it goes back under."""

    status: JobStatus  # the end meant (queued: handed back to the queue)
    step: int  # where the end sits in the job's stream
    write: Callable[[], bool] | None = None  # the guarded move; None: the row has it already
    event: dict[str, Any] = field(default_factory=dict)  # told with the status
    result: dict[str, Any] = field(default_factory=dict)  # RQ's result, with the status
    row_says: bool = False  # the row, read after the write, says the end to tell
    told_by: Callable[[int, dict[str, Any]], None] | None = None  # the attempt's publisher
    entry: str | None = None  # handed back: the queue entry of `job`'s row
    job: Job | None = None
    then: Callable[[], None] | None = None  # after a hand-back's write, before its enqueue
    why: str = ""  # for the log
    level: int = logging.INFO


def finish(a: Attempt, end: End) -> dict[str, Any]:
    """Every end of an attempt, one way: the guarded write; then, for a job handed back, one
    guarded enqueue; for an ended one, one guarded publish of its end, if the end is this
    attempt's own."""
    moved = end.write() if end.write is not None else True
    if end.entry is not None:
        return _back_on_queue(a, end, moved)
    status, own = end.status, True
    if end.row_says or not moved:
        row = a.row()
        status = row[1] if row else JobStatus.failed
        own = status.terminal and row is not None and row[0] == a.number
    payload = {"status": status, **end.event}
    if end.told_by is not None:
        end.told_by(end.step, payload)  # after the attempt's points; it proves its own fence
    elif own:
        publish_end(a, end.step, payload)
    if end.why:
        log.log(end.level, "job %s ended %s: %s", a.job_id, status, end.why)
    return {"status": status, **end.result}


def _back_on_queue(a: Attempt, end: End, moved: bool) -> dict[str, Any]:
    if not moved or end.job is None:
        log.warning("job %s: attempt %d no longer owns it; not requeueing", a.job_id, a.number)
        return {"status": SUPERSEDED}
    if end.then is not None:
        end.then()
    log.log(end.level, "job %s %s; back on the queue as %s", a.job_id, end.why, end.entry)
    enqueue_or_leave(a.r, a.settings, end.job, end.entry, what=end.why)
    return {"status": JobStatus.queued, **end.result}


def publish_end(a: Attempt, step: int, payload: dict[str, Any]) -> None:
    """The end of this attempt onto its job's stream, best effort: the database has it."""
    try:
        publish_status(a.r, a.job_id, step, payload, attempt=a.number)
    except RedisError as e:
        log.warning("job %s: could not publish its end: %s", a.job_id, e)


def fail(a: Attempt, step: int, e: TrainqError) -> dict[str, Any]:
    """The job ends failed (canceled, if the user stopped it), fenced by the attempt's number
    once it has one; only this attempt's own end (or that of a job no attempt ran) is told:
    where the stream's fence is missing, the write vouches for itself."""
    status = JobStatus.canceled if isinstance(e, TrainingStopped) else JobStatus.failed
    fence = a.number or None  # None: no attempt claimed the job

    def write() -> bool:
        with a.db.writer() as s:
            return end_job(
                s, job_id=a.job_id, status=status, code=e.code, message=e.message, attempt=fence
            )

    error = {"code": e.code, "message": e.message}
    said = {"error": error}
    return finish(a, End(status, step, write, said, said, row_says=True, why=e.message))

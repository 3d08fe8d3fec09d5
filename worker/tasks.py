"""The RQ job function. Its import path, `worker.tasks.train`, is part of the queue contract
(core.queue): keep it stable."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

from pydantic import ValidationError
from redis import Redis
from redis.exceptions import RedisError
from rq import get_current_job
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import Database, Job, UserDataset
from core.errors import (
    DatasetNotFound,
    InternalError,
    InvalidSpec,
    JobSuperseded,
    OutOfMemory,
    TrainingPreempted,
    TrainingStopped,
    TrainqError,
    field_problems,
)
from core.logs import current_job
from core.queue import VIA_API, enqueue_job
from core.spec import JobSpec, JobStatus, user_dataset_id
from core.store import (
    claim_job,
    create_job,
    dataset_data,
    end_job,
    epoch_metrics,
    get_dataset,
    get_job,
    latest_checkpoint,
    preempt_job,
    save_epoch,
    save_steps,
    set_total_steps,
    succeed_job,
)
from core.stream import Publisher, epoch_entry, publish_status, status_entry, step_entries
from core.train import Callbacks, EpochMetrics, StepMetrics, TrainResult
from core.train import train as run_training
from core.train.data import user_dataset_path
from core.train.loop import RunInfo, is_out_of_memory
from core.worker_stats import publish_worker_stats
from worker.heartbeat import Heartbeat

log = logging.getLogger("trainq.worker")
CANCEL_POLL_S = 0.25
COMMIT_POLL_S = 0.05
RETRY_FIRST_S = 0.1  # a database write's first retry; the pause doubles up to RETRY_MAX_S
RETRY_MAX_S = 2.0
T = TypeVar("T")


def train(
    spec: Any, owner: str | None = None, job_id: str | None = None, via: str | None = None
) -> dict[str, Any]:
    """Run one training job: validate, claim, train (resuming from the last checkpoint),
    store the results. Every outcome ends in the job row; nothing is retried by RQ.

    `job_id` is given only when the queue entry's id is not the job's own (a requeue).
    `via="api"`: the API enqueued it before committing its row (core.queue.VIA_API)."""
    rq_job = get_current_job()
    if rq_job is None:
        raise RuntimeError("worker.tasks.train runs inside an RQ worker")
    settings = Settings()
    db = Database.from_settings(settings)
    current_job.set(job_id or rq_job.id)
    try:
        with _Preemption() as preemption:  # SIGTERM from worker.run: hand the job back
            return _run(
                job_id or rq_job.id,
                rq_job.id,
                spec,
                owner,
                settings,
                db,
                rq_job.connection,
                rq_job.worker_name or "?",
                preemption,
                via=via,
            )
    finally:
        db.dispose()


def _run(
    job_id: str,
    queue_entry: str,
    raw_spec: Any,
    owner: str | None,
    settings: Settings,
    db: Database,
    r: Redis,
    worker_name: str,
    preemption: _Preemption,
    via: str | None,
) -> dict[str, Any]:
    try:
        uuid.UUID(job_id)
    except ValueError:
        log.error("refusing job %r: trainq job ids are UUIDs", job_id)
        return {"status": JobStatus.failed, "error": "invalid job id"}
    if via == VIA_API and not _await_commit(db, job_id, settings.commit_wait_s):
        log.warning(
            "refusing queue entry %s: the API never committed job %s (its submission failed "
            "and the client was told so); nothing runs",
            queue_entry,
            job_id,
        )
        return {"status": "refused", "error": "the submission of this job failed"}
    spec, refused = _admit(db, job_id, queue_entry, raw_spec, owner)
    if spec is None or refused is not None:
        return _fail(db, r, job_id, None, 0, refused or InvalidSpec("spec", "invalid"))

    from core.train.device import device_name, resolve_device

    device = device_name(resolve_device("auto"))
    with db.writer() as s:
        job = claim_job(
            s, job_id=job_id, worker=worker_name, device=device, queue_entry=queue_entry
        )
        checkpoint = latest_checkpoint(s, job_id=job_id) if job else None
        resume = (checkpoint.data, checkpoint.step) if checkpoint else None
        history = _history(s, job_id) if checkpoint else []
    if job is None:
        log.info(
            "job %s is not queued under entry %s (ended, running elsewhere, or on the queue "
            "under another entry); not running it",
            job_id,
            queue_entry,
        )
        return {"status": "skipped"}
    start_step = resume[1] if resume else 0
    sink = _Sink(job_id, job.attempt, worker_name, spec.batch_size, db, r, settings)
    sink.status(
        start_step,
        {
            "status": JobStatus.running,
            "attempt": job.attempt,
            "device": device,  # not the worker's name: events are for every key (api.events)
            "resumed_from_step": start_step,
        },
    )
    callbacks = sink.callbacks()
    callbacks.should_preempt = preemption.asked
    sink.heart.stop_asked = preemption.asked  # into the job row at once, between steps or not
    try:
        sink.heart.start()
        place_dataset(db, settings.data_dir, spec.dataset)
        sink.heart.touch()
        result = run_training(
            spec,
            data_dir=settings.data_dir,
            callbacks=callbacks,
            resume=resume[0] if resume else None,
            history=history,
        )
        return _succeed(sink, result)
    except JobSuperseded as e:
        log.warning("job %s: %s; stopping this attempt", job_id, e.message)
        return {"status": "superseded"}
    except DatabaseAway as e:
        log.error(
            "job %s: attempt %d could not write to the database (%s); it stays running with "
            "its heartbeat stopped, and the reconciler requeues it from its last checkpoint",
            job_id,
            job.attempt,
            e,
        )
        return {"status": "lost"}
    except TrainingPreempted as e:
        return _hand_back(db, r, settings, job, sink, e)
    except TrainqError as e:
        sink.flush_history()
        return _fail(db, r, job_id, job.attempt, sink.last_step or start_step, e)
    except Exception as e:  # not trainq's own: a retry would meet it again
        log.exception("job %s: attempt %d met an unexpected error", job_id, job.attempt)
        with contextlib.suppress(Exception):  # the error may be the database's own
            sink.flush_history()
        return _fail(db, r, job_id, job.attempt, sink.last_step or start_step, _unexpected(e))
    finally:
        sink.heart.stop()


def _admit(
    db: Database, job_id: str, queue_entry: str, raw_spec: Any, owner: str | None
) -> tuple[JobSpec | None, InvalidSpec | None]:
    """The spec to train, or why none. A job that has a row trains the row's spec for the
    row's owner: the database is the truth, a queue entry only its carrier. A job submitted
    straight to the queue gets its row here, from the entry, and may use an uploaded data
    set only if it is the entry's owner's (no owner: an admin's, any set)."""
    with db.writer() as s:
        row = get_job(s, job_id=job_id)
        if row is not None:
            if row.spec != raw_spec or row.owner != owner:
                log.warning(
                    "queue entry %s carries a spec or owner other than job %s's row; the row's run",
                    queue_entry,
                    job_id,
                )
            spec, problem = _validate(row.spec)
            return spec, None if spec else InvalidSpec("spec", problem or "invalid")
        spec, problem = _validate(raw_spec)
        refused = InvalidSpec("spec", problem or "invalid") if spec is None else None
        if spec is not None and not _may_use(s, spec.dataset, owner):
            refused = InvalidSpec(
                "dataset",
                f"no data set {spec.dataset!r}: upload one with POST /datasets, or list yours "
                "with GET /datasets",
            )
        create_job(
            s,
            job_id=job_id,
            spec=spec or {"as_sent": raw_spec},
            owner=owner,
            queue_entry=queue_entry,
        )
        if refused is not None:  # ended with its row: no requeue ever runs it
            end_job(
                s,
                job_id=job_id,
                status=JobStatus.failed,
                code=refused.code,
                message=refused.message,
            )
    return spec, refused


def _may_use(s: Session, dataset: str, owner: str | None) -> bool:
    """Whether `owner` may train on `dataset`; another owner's set is refused exactly like a
    missing one, as the API does."""
    ds_id = user_dataset_id(dataset)
    if ds_id is None or owner is None:
        return True
    ds = get_dataset(s, dataset_id=ds_id)
    return ds is not None and ds.owner == owner


def _history(s: Session, job_id: str) -> list[EpochMetrics]:
    """The epochs the job's earlier attempts finished (stored with their checkpoints)."""
    names = [f.name for f in dataclasses.fields(EpochMetrics)]
    return [
        EpochMetrics(**{n: getattr(row, n) for n in names})
        for row in epoch_metrics(s, job_id=job_id)
    ]


def _succeed(sink: _Sink, result: TrainResult) -> dict[str, Any]:
    summary = result.summary()
    ok = sink.write(
        lambda s: succeed_job(
            s,
            job_id=sink.job_id,
            attempt=sink.attempt,
            result=summary,
            record=result.record,
            model=result.model,
            sha256=result.model_sha256,
        )
    )
    status = JobStatus.succeeded if ok else _status_of(sink.db, sink.job_id)
    sink.status(result.steps, {"status": status, "result": summary})
    return {"status": status, **summary}


def _unexpected(e: Exception) -> TrainqError:
    """What the user is told of an error that is not trainq's own; the log has the rest."""
    if is_out_of_memory(e):  # the trainer names its own; this is outside the run
        return OutOfMemory(
            "the worker ran out of memory outside the training run (placing the data set or "
            "storing the model); try a smaller data set or narrower conv/hidden widths"
        )
    if isinstance(e, SQLAlchemyError):
        # A DBAPIError's text carries the statement and its parameters (a checkpoint's
        # bytes): say only what the database said.
        cause = e.orig if isinstance(e, DBAPIError) else e
        what = f"a database write of this attempt failed ({type(cause).__name__}: {cause})"
    else:
        what = f"the worker met an unexpected error ({type(e).__name__}: {e})"
    return InternalError(
        f"{what[:500]}; the job is not retried, and the worker's log has the traceback"
    )


class DatabaseAway(Exception):
    """A write of a running attempt kept failing with a transient database error for about
    the heartbeat timeout: the attempt gives the job up to the reconciler."""


# SQLite's errors that pass (a full disk freed, a lock released); its other operational
# errors (a missing table, a read-only file) would only come back.
_SQLITE_TRANSIENT = ("database or disk is full", "locked", "disk i/o error")


def is_transient(e: SQLAlchemyError) -> bool:
    """A database error that a retry of the same write may outlive: a lost connection, a
    server restarting or failing over, a full disk, a lock held too long."""
    if isinstance(e, DBAPIError) and e.connection_invalidated:
        return True
    if not isinstance(e, OperationalError | InterfaceError):
        return False
    if isinstance(e.orig, sqlite3.Error):
        return any(m in str(e.orig).lower() for m in _SQLITE_TRANSIENT)
    return True


def retry_write(write: Callable[[Session], T], db: Database, for_s: float, what: str) -> T:
    """`write` in a transaction of its own, again with back-off while it fails transiently,
    for up to `for_s`; then DatabaseAway. Every write retried so is idempotent (a re-run
    replaces what a committed one whose reply was lost stored); JobSuperseded passes."""
    deadline = time.monotonic() + for_s
    pause = RETRY_FIRST_S
    while True:
        try:
            with db.writer() as s:
                return write(s)
        except SQLAlchemyError as e:
            if not is_transient(e):
                raise
            cause = e.orig if isinstance(e, DBAPIError) else e  # not the statement's bytes
            if time.monotonic() + pause > deadline:
                raise DatabaseAway(f"{what}: {type(cause).__name__}: {cause}"[:500]) from e
            log.warning("%s failed (%s); trying again in %.1f s", what, cause, pause)
        time.sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)


class _Preemption:
    """The work horse's SIGTERM, which worker.run sends it on a warm shutdown (docker stop, a
    spot reclaim, a node drain): the running attempt stops at its next step and hands the
    job back. Outside the step loop (placing the data set, evaluation, export) there may be
    no next step before the launcher's SIGKILL; the heartbeat thread records the request in
    the job row, so that the reconciler counts that loss as a preemption. RQ sets SIGTERM to
    its default (death) in a fresh work horse; this handler holds for the job function's
    run, and the one it replaced comes back after."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _Preemption:
        if threading.current_thread() is threading.main_thread():  # signals need the main one
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        self.requested = True

    def asked(self) -> bool:
        return self.requested


def _hand_back(
    db: Database, r: Redis, settings: Settings, job: Job, sink: _Sink, e: TrainingPreempted
) -> dict[str, Any]:
    """Preempted: the job goes back to queued with its mid-epoch checkpoint and its steps
    (one transaction), and onto the queue at once, to resume at the next step elsewhere.
    Should the enqueue fail, the reconciler enqueues the queued job after its grace."""
    entry = f"{job.id}-p{job.attempt}"  # one preemption per attempt: a fresh entry id
    with db.writer() as s:
        moved = preempt_job(
            s,
            job_id=job.id,
            attempt=job.attempt,
            epoch=e.epoch,
            step=e.step,
            steps=sink.unsaved,
            checkpoint=e.checkpoint,
            queue_entry=entry,
        )
    if not moved:
        log.warning("job %s: attempt %d no longer owns it; not requeueing", job.id, job.attempt)
        return {"status": "superseded"}
    sink.unsaved = []
    sink.flush_history()  # nothing left to store; the steps Redis missed go out
    try:
        enqueue_job(
            r,
            queue=settings.queue,
            job_id=job.id,
            spec=job.spec,
            owner=job.owner,
            timeout_s=settings.job_timeout_s,
            queue_entry=entry,
        )
    except RedisError as re:
        log.warning("job %s: preempted, but not enqueued (%s); the reconciler will", job.id, re)
    log.info("job %s preempted at step %d; back on the queue as %s", job.id, e.step, entry)
    return {"status": JobStatus.queued, "preempted_at_step": e.step}


def _await_commit(db: Database, job_id: str, bound_s: float) -> bool:
    """Whether the row of a job the API enqueued shows up within `bound_s`: the API commits
    it a moment after the enqueue, or rolls it back (then it never comes)."""
    deadline = time.monotonic() + bound_s
    while True:
        with db.reader() as s:
            if get_job(s, job_id=job_id) is not None:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(COMMIT_POLL_S)


def place_dataset(db: Database, data_dir: Path, name: str) -> None:
    """An uploaded data set ("ds:<id>") goes from the database to the file the trainer reads
    (core.train.data.user_dataset_path), once per worker host: written atomically, and
    rewritten if a file is there but is not the stored one."""
    ds_id = user_dataset_id(name)
    if ds_id is None:
        return
    path = user_dataset_path(name, data_dir)
    with db.writer() as s:
        if path.exists():
            row = s.get(UserDataset, ds_id)
            if row is not None and _sha256(path) == row.sha256:
                return
        found = dataset_data(s, dataset_id=ds_id)
    if found is None:
        raise DatasetNotFound(f"data set {name!r} does not exist (it was never uploaded)")
    sha256, blob = found
    if hashlib.sha256(blob).hexdigest() != sha256:
        raise DatasetNotFound(f"data set {name!r}: the stored copy failed its sha256 check")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # workers sharing a data folder may race
    tmp.write_bytes(blob)
    os.replace(tmp, path)  # atomic: the trainer never sees half a file


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _validate(raw: Any) -> tuple[JobSpec | None, str | None]:
    try:
        return JobSpec.model_validate(raw), None
    except ValidationError as e:
        return None, "; ".join(field_problems(e))


def _fail(
    db: Database, r: Redis, job_id: str, attempt: int | None, step: int, e: TrainqError
) -> dict[str, Any]:
    status = JobStatus.canceled if isinstance(e, TrainingStopped) else JobStatus.failed
    with db.writer() as s:
        end_job(s, job_id=job_id, status=status, code=e.code, message=e.message, attempt=attempt)
    row = job_row(db, job_id)
    final = row[1] if row else JobStatus.failed
    error = {"code": e.code, "message": e.message}
    try:
        # Only this attempt's own end (or that of a job no attempt ran): the write vouches
        # for itself, so a superseded attempt must not make it where the fence is missing.
        if final.terminal and row and row[0] == (attempt or 0):
            publish_status(r, job_id, step, {"status": final, "error": error}, attempt=attempt or 0)
    except RedisError as re:
        log.warning("job %s: could not publish its end: %s", job_id, re)
    log.info("job %s ended %s: %s", job_id, final, e.message)
    return {"status": final, "error": error}


def job_row(db: Database, job_id: str) -> tuple[int, JobStatus] | None:
    """The job row's attempt and status now: what proves an attempt's ownership where the
    stream's fence went missing (core.stream.Publisher)."""
    with db.reader() as s:
        job = get_job(s, job_id=job_id)
        return (job.attempt, JobStatus(job.status)) if job else None


def _status_of(db: Database, job_id: str) -> JobStatus:
    with db.writer() as s:
        job = get_job(s, job_id=job_id)
        return JobStatus(job.status) if job else JobStatus.failed


class _Sink:
    """Trainer callbacks -> Redis (every block of steps, one round trip) and the DB (once per
    epoch: that epoch's steps, its metrics and its checkpoint in one transaction); every
    callback tells the heartbeat (worker.heartbeat) that the trainer is moving.

    Redis is best effort here: while it is away, points wait in memory and go out when it
    is back; the database keeps the full history either way."""

    def __init__(
        self,
        job_id: str,
        attempt: int,
        worker: str,
        batch_size: int,
        db: Database,
        r: Redis,
        settings: Settings,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.worker = worker
        self.batch_size = batch_size
        self.db = db
        self.r = r
        self.stream = Publisher(
            r, job_id, attempt, settings.metrics_maxlen, row=lambda: job_row(db, job_id)
        )
        self.heart = Heartbeat(
            db,
            job_id=job_id,
            attempt=attempt,
            every_s=min(5.0, settings.heartbeat_timeout_s / 3),
            stall_timeout_s=settings.stall_timeout_s,
        )
        self.unsaved: list[StepMetrics] = []
        self.last_step = 0
        self.pending_epoch: EpochMetrics | None = None
        self.next_cancel_check = 0.0
        self.retry_for_s = settings.heartbeat_timeout_s

    def write(self, write: Callable[[Session], T]) -> T:
        """A write of this attempt, retried through a database blip (retry_write)."""
        what = f"job {self.job_id}: a database write of attempt {self.attempt}"
        return retry_write(write, self.db, self.retry_for_s, what)

    def callbacks(self) -> Callbacks:
        return Callbacks(
            on_start=self.on_start,
            on_steps=self.on_steps,
            on_epoch=self.on_epoch,
            on_checkpoint=self.on_checkpoint,
            should_stop=self.should_stop,
            on_progress=self.heart.touch,
        )

    def status(self, step: int, payload: dict[str, Any]) -> None:
        self.stream.add([status_entry(step, payload)])
        self.stream.flush(force=JobStatus(payload["status"]).terminal)  # the end: try anyway

    def on_start(self, info: RunInfo) -> None:
        self.write(
            lambda s: set_total_steps(
                s, job_id=self.job_id, attempt=self.attempt, total_steps=info.total_steps
            )
        )

    def on_steps(self, points: Sequence[StepMetrics]) -> None:
        self.heart.touch()
        if self.heart.superseded:
            raise JobSuperseded(f"attempt {self.attempt} of job {self.job_id} no longer owns it")
        self.unsaved.extend(points)
        self.stream.add(step_entries(points))
        self.last_step = points[-1].step
        if not self.stream.flush():
            return
        last = points[-1]
        try:
            publish_worker_stats(
                self.r,
                self.worker,
                {
                    "job_id": self.job_id,
                    "images_per_second": last.images_per_second,
                    "step_seconds": self.batch_size / max(last.images_per_second, 1e-9),
                    "memory_allocated": last.memory_allocated,
                    "memory_reserved": last.memory_reserved,
                    "memory_peak": last.memory_peak,
                },
            )
        except RedisError as e:
            self.stream.failed(e)

    def on_epoch(self, m: EpochMetrics) -> None:
        self.pending_epoch = m  # stored with its checkpoint, which comes next

    def on_checkpoint(self, epoch: int, blob: bytes) -> None:
        m = self.pending_epoch
        if m is None or m.epoch != epoch:
            raise RuntimeError("checkpoint without its epoch metrics")
        steps = [p for p in self.unsaved if p.step <= m.step]
        self.write(
            lambda s: save_epoch(
                s, job_id=self.job_id, attempt=self.attempt, epoch=m, steps=steps, checkpoint=blob
            )
        )
        self.unsaved = [p for p in self.unsaved if p.step > m.step]
        self.heart.touch()
        self.stream.add([epoch_entry(m)])  # after the epoch's steps, however long they wait
        self.stream.flush()

    def flush_history(self) -> None:
        """A run that stops mid-epoch keeps the steps it made."""
        try:
            steps = self.unsaved
            self.write(
                lambda s: save_steps(s, job_id=self.job_id, attempt=self.attempt, steps=steps)
            )
        except JobSuperseded:
            return
        self.unsaved = []
        self.stream.flush(force=True)  # before the end; if Redis is away, the database has them

    def should_stop(self) -> bool:
        if self.heart.cancel_requested:
            return True
        now = time.monotonic()
        if now < self.next_cancel_check:
            return False
        self.next_cancel_check = now + CANCEL_POLL_S
        return self.stream.cancel_requested()

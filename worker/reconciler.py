"""The reconciler: the database is the source of truth, and each pass keeps the queue true
to it — a lost attempt's job is requeued or ended, a queued job with no live entry is
enqueued again, and running sweeps are topped up. See docs/jobs.md."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from core.config import Settings
from core.db import Database, DbTime, Job, as_utc, db_ago
from core.queue import enqueue_row
from core.redis_client import connect
from core.retention import retention_pass
from core.spec import JobStatus
from core.store import end_job, lost_jobs, requeue_job, set_queue_entry, stale_queued_jobs
from core.store.lifecycle import restarts_used
from core.store.sweeps import running_sweep_ids
from core.stream import publish_status
from core.sweeps.trials import advance
from worker.entry_checks import entry_is_live, stop_entry
from worker.placed_datasets import prune_placed

log = logging.getLogger("trainq.reconcile")


@dataclass
class Report:
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    reenqueued: list[str] = field(default_factory=list)
    trials: list[str] = field(default_factory=list)  # sweeps that got trials here


def reconcile_once(db: Database, r: Redis, settings: Settings) -> Report:
    """One pass. Each job is handled on its own: one that fails (junk a Redis writer put in
    its queue entry, say) is logged and the pass goes on to the next; Redis or the database
    being away ends the pass."""
    report = Report()
    with db.writer() as s:
        lost = list(lost_jobs(s, silent_since=db_ago(settings.heartbeat_timeout_s)))
    for job in lost:
        with _on_its_own(job):
            handle_lost(db, r, settings, job, report)
    with db.writer() as s:
        waiting = list(stale_queued_jobs(s, enqueued_before=db_ago(settings.queue_grace_s)))
    for job in waiting:
        with _on_its_own(job):
            _handle_waiting(db, r, settings, job, report)
    _advance_sweeps(db, r, settings, report)
    return report


def _advance_sweeps(db: Database, r: Redis, settings: Settings, report: Report) -> None:
    """Every running sweep topped up: the trials that a crash kept from being made when
    one ended (core.sweeps.trials), or that a quota held back, are made now."""
    with db.reader() as s:
        sweeps = running_sweep_ids(s)
    for sweep_id in sweeps:
        try:
            if advance(db, r, settings, sweep_id=sweep_id):
                report.trials.append(sweep_id)
        except (RedisError, SQLAlchemyError, OSError):
            raise
        except Exception:
            log.exception("sweep %s could not be advanced; the pass goes on", sweep_id)


@contextmanager
def _on_its_own(job: Job) -> Iterator[None]:
    try:
        yield
    except (RedisError, SQLAlchemyError, OSError):
        raise  # away: the whole pass is skipped, and the next one tries again
    except Exception:
        log.exception("job %s could not be reconciled; the pass goes on", job.id)


def _handle_waiting(db: Database, r: Redis, settings: Settings, job: Job, report: Report) -> None:
    if job.queue_entry and entry_is_live(r, job.queue_entry):
        return
    entry = f"{job.id}-q{uuid.uuid4().hex[:8]}"
    with db.writer() as s:
        if not set_queue_entry(s, job_id=job.id, queue_entry=entry, seen=job.queue_entry):
            return  # another reconciler (or a worker) got there first
    enqueue_row(r, settings, job, entry)
    report.reenqueued.append(job.id)
    log.warning("job %s was queued but not on the queue; enqueued again", job.id)


def handle_lost(db: Database, r: Redis, settings: Settings, job: Job, report: Report) -> None:
    """A running job whose attempt went silent: requeued to resume from its last checkpoint,
    or ended (canceled, or failed once its restarts are used up). `job` may be a stale read:
    each update also requires the attempt to be silent still, so an attempt that beat since
    then (alive after all) is left alone."""
    silent_since = db_ago(settings.heartbeat_timeout_s)
    # An attempt handed back by a stopping worker (a preemption) is not a restart, and
    # neither is one whose worker was asked to stop and killed before it could hand back.
    preempted = job.stop_requested_attempt == job.attempt
    max_restarts = int(job.spec.get("max_restarts", 2))
    if job.cancel_requested or (not preempted and restarts_used(job) >= max_restarts):
        ended = _end_lost(db, job, silent_since, max_restarts)
        if ended is not None:
            _stop_silent_horse(r, job)
            report.failed.append(job.id)
            _publish(r, job, ended)
        return
    entry = f"{job.id}-a{job.attempt + 1}"
    with db.writer() as s:
        if not requeue_job(
            s,
            job_id=job.id,
            attempt=job.attempt,
            queue_entry=entry,
            silent_since=silent_since,
            preempted=preempted,
        ):
            return
    _stop_silent_horse(r, job)
    enqueue_row(r, settings, job, entry)
    report.requeued.append(job.id)
    log.warning(
        "job %s lost its worker %s (%s%s); requeued as attempt %d",
        job.id,
        job.worker,
        _last_seen(job),
        ", asked to stop: a preemption" if preempted else "",
        job.attempt + 1,
    )


def _end_lost(
    db: Database, job: Job, silent_since: DbTime, max_restarts: int
) -> dict[str, object] | None:
    """The lost job ended canceled (a cancel was asked) or failed `worker_lost`; the status
    to publish, or None if the attempt beat since or the job ended otherwise."""
    status = JobStatus.canceled if job.cancel_requested else JobStatus.failed
    code = "canceled" if job.cancel_requested else "worker_lost"
    message = f"the worker running attempt {job.attempt} was lost ({_last_seen(job)})" + (
        "" if job.cancel_requested else f"; max_restarts {max_restarts} used up"
    )
    with db.writer() as s:
        moved = end_job(
            s,
            job_id=job.id,
            status=status,
            code=code,
            message=message,
            from_statuses=(JobStatus.running,),
            attempt=job.attempt,
            silent_since=silent_since,
        )
    if not moved:
        return None
    log.warning("job %s lost its worker %s (%s): %s", job.id, job.worker, _last_seen(job), status)
    return {"status": status, "error": {"code": code, "message": message}}


def _last_seen(job: Job) -> str:
    return f"last heartbeat {as_utc(job.heartbeat_at)}"  # the job's message: no host in it


def _stop_silent_horse(r: Redis, job: Job) -> None:
    """A lost attempt may be stuck rather than dead: stop its work horse, if any, so that it
    frees its GPU (its writes are fenced off either way). Sent only once the job has moved
    on: an attempt that turned out alive is never stopped."""
    if job.queue_entry and stop_entry(r, job.queue_entry):
        log.warning("job %s: sent RQ's stop command to its silent work horse", job.id)


def _publish(r: Redis, job: Job, payload: dict[str, object]) -> None:
    try:
        publish_status(r, job.id, job.progress_step, payload, attempt=job.attempt)
    except Exception as e:  # the stream is best effort; the database has the truth
        log.warning("could not publish the status of job %s: %s", job.id, e)


class Reconciler:
    def __init__(self, settings: Settings, redis_url: str) -> None:
        self.settings = settings
        self.redis_url = redis_url
        self.db: Database | None = None

    def __call__(self) -> None:
        # Created lazily, and only in the launcher: its children fork from a clean process.
        if self.db is None:
            self.db = Database.from_settings(self.settings)
        db, settings = self.db, self.settings
        r = connect(self.redis_url)
        try:
            _guarded("reconcile", lambda: _reconcile(db, r, settings))
        finally:
            r.close()
        # The database's and the disk's halves need no Redis: they go on while it is away.
        _guarded("retention", lambda: retention_pass(db, settings))
        _guarded("placed data sets", lambda: prune_placed(db, settings.data_dir))


def _reconcile(db: Database, r: Redis, settings: Settings) -> None:
    report = reconcile_once(db, r, settings)
    if report.requeued or report.failed or report.reenqueued or report.trials:
        log.warning("reconciled: %s", report)


def _guarded(what: str, step: Callable[[], object]) -> None:
    """One step of the pass: a lost connection or a full disk skips it until the next pass,
    and nothing ends the launcher that runs it (its workers would be orphaned)."""
    try:
        step()
    except (RedisError, SQLAlchemyError, OSError) as e:
        log.warning("%s pass skipped: %s", what, e)
    except Exception:
        log.exception("%s pass failed; the next one tries again", what)

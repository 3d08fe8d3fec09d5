"""A claimed attempt, trained to its end: succeeded, failed, canceled, handed back
(preempted), superseded, or given up to the reconciler while the database stays away."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from core.errors import (
    ExportCheckUnavailable,
    InternalError,
    JobSuperseded,
    OutOfMemory,
    TrainingPreempted,
    TrainingStopped,
    TrainqError,
    TrialPruned,
)
from core.spec import JobSpec, JobStatus
from core.store import end_job, get_job, preempt_job, retry_job, succeed_job
from core.stream import publish_status
from core.train import TrainResult, is_out_of_memory
from core.train import train as run_training
from worker.attempt import Attempt, Claim
from worker.dataset_files import place_dataset
from worker.reconciler import enqueue_row, restarts_used
from worker.recorder import Recorder
from worker.retry import DatabaseAway

log = logging.getLogger("trainq.worker")


def execute(a: Attempt, spec: JobSpec, claim: Claim) -> dict[str, Any]:
    """Train the claimed attempt from its last checkpoint, and store how it ended. Every
    outcome ends in the job row; nothing is retried by RQ."""
    job = claim.job
    trial = (
        (job.sweep_id, job.trial_number) if job.sweep_id and job.trial_number is not None else None
    )
    rec = Recorder(a, spec, trial=trial)
    rec.status(
        claim.start_step,
        {
            "status": JobStatus.running,
            "attempt": a.number,
            "device": claim.device,  # not the worker's name: events are for every key (api.events)
            "resumed_from_step": claim.start_step,
        },
    )
    try:
        rec.heart.start()
        place_dataset(a.db, a.settings.data_dir, spec.dataset)
        rec.heart.touch()
        result = run_training(
            spec,
            data_dir=a.settings.data_dir,
            callbacks=rec.callbacks(),
            resume=claim.checkpoint,
            history=claim.history,
            export_check_timeout_s=a.settings.export_check_timeout_s,
        )
        return _succeed(a, rec, result)
    except JobSuperseded as e:
        return _superseded(a, rec, e)
    except DatabaseAway as e:
        log.error(
            "job %s: attempt %d could not write to the database (%s); it stays running with "
            "its heartbeat stopped, and the reconciler requeues it from its last checkpoint",
            a.job_id,
            a.number,
            e,
        )
        return {"status": "lost"}
    except TrainingPreempted as e:
        return _hand_back(a, claim, rec, e)
    except TrialPruned as e:
        return _pruned(a, rec, e)
    except ExportCheckUnavailable as e:
        return _retry(a, claim, rec, e, spec.max_restarts)
    except TrainqError as e:
        rec.flush_history()
        return fail(a, rec.last_step or claim.start_step, e)
    except Exception as e:  # not trainq's own: a retry would meet it again
        log.exception("job %s: attempt %d met an unexpected error", a.job_id, a.number)
        with contextlib.suppress(Exception):  # the error may be the database's own
            rec.flush_history()
        return fail(a, rec.last_step or claim.start_step, unexpected_error(e))
    finally:
        rec.heart.stop()


def _succeed(a: Attempt, rec: Recorder, result: TrainResult) -> dict[str, Any]:
    summary = result.summary()
    ok = a.write(
        lambda s: succeed_job(
            s,
            job_id=a.job_id,
            attempt=a.number,
            result=summary,
            record=result.record,
            models=list(result.models.values()),
        )
    )
    status = JobStatus.succeeded if ok else _status_of(a)
    rec.status(result.steps, {"status": status, "result": summary})
    return {"status": status, **summary}


def _superseded(a: Attempt, rec: Recorder, e: JobSuperseded) -> dict[str, Any]:
    """A write found the job no longer this attempt's. It may be this attempt's own end,
    committed with its reply lost (the epoch that pruned it), then retried: if the row ended
    under this attempt, that end is published; otherwise another owns the job now."""
    try:
        with a.db.reader() as s:
            job = get_job(s, job_id=a.job_id)
    except SQLAlchemyError:
        job = None
    if job is not None and job.attempt == a.number and JobStatus(job.status).terminal:
        error = {"code": job.error_code, "message": job.error_message or ""}
        payload = {"status": job.status, "error": error if job.error_code else None}
        try:
            publish_status(a.r, a.job_id, rec.last_step, payload, attempt=a.number)
        except RedisError as re:
            log.warning("job %s: could not publish its end: %s", a.job_id, re)
        return {"status": job.status}
    log.warning("job %s: %s; stopping this attempt", a.job_id, e.message)
    return {"status": "superseded"}


def _pruned(a: Attempt, rec: Recorder, e: TrialPruned) -> dict[str, Any]:
    """The trial already ended `pruned` with its last epoch (worker.recorder): say so."""
    step = rec.last_step
    error = {"code": e.code, "message": e.message}
    try:
        publish_status(
            a.r, a.job_id, step, {"status": JobStatus.pruned, "error": error}, attempt=a.number
        )
    except RedisError as re:
        log.warning("job %s: could not publish its end: %s", a.job_id, re)
    log.info("job %s %s", a.job_id, e.message)
    return {"status": JobStatus.pruned, "error": error}


def _status_of(a: Attempt) -> JobStatus:
    with a.db.writer() as s:
        job = get_job(s, job_id=a.job_id)
        return JobStatus(job.status) if job else JobStatus.failed


def unexpected_error(e: Exception) -> TrainqError:
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


def _hand_back(a: Attempt, claim: Claim, rec: Recorder, e: TrainingPreempted) -> dict[str, Any]:
    """Preempted: the job goes back to queued with its mid-epoch checkpoint and its steps
    (one transaction), and onto the queue at once, to resume at the next step elsewhere.
    Should the enqueue fail, the reconciler enqueues the queued job after its grace."""
    entry = f"{a.job_id}-p{a.number}"  # one preemption per attempt: a fresh entry id
    with a.db.writer() as s:
        moved = preempt_job(
            s, job_id=a.job_id, attempt=a.number, queue_entry=entry,
            epoch=e.epoch, step=e.step, steps=rec.unsaved, checkpoint=e.checkpoint,
        )  # fmt: skip
    if not moved:
        log.warning("job %s: attempt %d no longer owns it; not requeueing", a.job_id, a.number)
        return {"status": "superseded"}
    rec.unsaved = []
    rec.flush_history()  # nothing left to store; the steps Redis missed go out
    try:
        enqueue_row(a.r, a.settings, claim.job, entry)
    except RedisError as re:
        log.warning("job %s: preempted, but not enqueued (%s); the reconciler will", a.job_id, re)
    log.info("job %s preempted at step %d; back on the queue as %s", a.job_id, e.step, entry)
    return {"status": JobStatus.queued, "preempted_at_step": e.step}


def _retry(
    a: Attempt, claim: Claim, rec: Recorder, e: ExportCheckUnavailable, max_restarts: int
) -> dict[str, Any]:
    """The machine could not check the exported model (its checking process was killed or
    ran out of time): not the job's fault. The job goes back to the queue as a restart, to
    resume from its final checkpoint elsewhere (only the export runs again); once its
    max_restarts are used up, it fails with the reason."""
    step = rec.last_step or claim.start_step
    rec.flush_history()
    job = claim.job
    if restarts_used(job) >= max_restarts:  # job.attempt is this attempt's number
        return fail(a, step, e)
    entry = f"{a.job_id}-r{a.number}"
    with a.db.writer() as s:
        if not retry_job(s, job_id=a.job_id, attempt=a.number, queue_entry=entry):
            return {"status": "superseded"}
    log.warning("job %s: %s; back on the queue as %s", a.job_id, e.message, entry)
    try:
        enqueue_row(a.r, a.settings, job, entry)
    except RedisError as re:
        log.warning("job %s: requeued, but not enqueued (%s); the reconciler will", a.job_id, re)
    return {"status": JobStatus.queued, "retried": e.code}


def fail(a: Attempt, step: int, e: TrainqError) -> dict[str, Any]:
    """The job ends failed (canceled, if the user stopped it), fenced by the attempt's number
    once it has one; only that end of it is published."""
    status = JobStatus.canceled if isinstance(e, TrainingStopped) else JobStatus.failed
    fence = a.number or None  # None: no attempt claimed the job
    with a.db.writer() as s:
        end_job(s, job_id=a.job_id, status=status, code=e.code, message=e.message, attempt=fence)
    row = a.row()
    final = row[1] if row else JobStatus.failed
    error = {"code": e.code, "message": e.message}
    try:
        # Only this attempt's own end (or that of a job no attempt ran): the write vouches
        # for itself, so a superseded attempt must not make it where the fence is missing.
        if final.terminal and row and row[0] == a.number:
            publish_status(a.r, a.job_id, step, {"status": final, "error": error}, attempt=a.number)
    except RedisError as re:
        log.warning("job %s: could not publish its end: %s", a.job_id, re)
    log.info("job %s ended %s: %s", a.job_id, final, e.message)
    return {"status": final, "error": error}

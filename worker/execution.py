"""A claimed attempt, trained to its end: each way it can end (succeeded, failed, canceled,
pruned, handed back, superseded, given up while the database is away) as an End for
worker.attempt.finish. See docs/jobs.md."""

from __future__ import annotations

import contextlib
import logging
from functools import partial
from typing import Any

from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from core.errors import (
    ExportCheckUnavailable,
    InternalError,
    InvalidSpec,
    JobSuperseded,
    OutOfMemory,
    TrainingPreempted,
    TrainqError,
    TrialPruned,
    WorkerDiskFull,
)
from core.files import disk_full
from core.spec import JobSpec, JobStatus
from core.store import get_job, preempt_job, retry_job, start_weights, succeed_job
from core.store.lifecycle import restarts_used
from core.train import TrainResult, is_out_of_memory
from core.train import train as run_training
from worker.attempt import SUPERSEDED, Attempt, Claim, End, fail, finish
from worker.dataset_files import place_dataset
from worker.kept import tell_worker
from worker.recorder import Recorder
from worker.retry import DatabaseAway

log = logging.getLogger("trainq.worker")


def execute(a: Attempt, spec: JobSpec, claim: Claim) -> dict[str, Any]:
    """Train the claimed attempt from its last checkpoint, and store how it ended. Every
    outcome ends in the job row; nothing is retried by RQ."""
    rec = _recorder(a, spec, claim)
    try:
        rec.heart.start()
        place_dataset(a.db, a.settings.data_dir, spec.dataset)
        tell_worker(spec.dataset)  # the set this admitted job trains on: its worker keeps it
        rec.heart.touch()
        result = run_training(
            spec,
            data_dir=a.settings.data_dir,
            callbacks=rec.callbacks(),
            resume=claim.checkpoint,
            history=claim.history,
            start_weights=_start_weights(a, spec, claim),
            export_check_timeout_s=a.settings.export_check_timeout_s,
        )
        return _succeed(a, rec, result)
    except JobSuperseded as e:
        return _superseded(a, rec, e)
    except DatabaseAway as e:
        return _given_up(a, e)
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
        if disk_full(e):  # but not a full disk: the machine's, and another may have room
            full = WorkerDiskFull(f"the worker host's disk is full ({e}); free space there")
            return _retry(a, claim, rec, full, spec.max_restarts)
        log.exception("job %s: attempt %d met an unexpected error", a.job_id, a.number)
        with contextlib.suppress(Exception):  # the error may be the database's own
            rec.flush_history()
        return fail(a, rec.last_step or claim.start_step, unexpected_error(e))
    finally:
        rec.heart.stop()


def _recorder(a: Attempt, spec: JobSpec, claim: Claim) -> Recorder:
    """The attempt's recorder (a trial's judges each epoch), its start told to the stream."""
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
    return rec


def _start_weights(a: Attempt, spec: JobSpec, claim: Claim) -> bytes | None:
    """The weights of the job init_from names, checked again here (the API checked them at
    submission: the job may since have been deleted or purged). None with a checkpoint: a
    resume starts from that."""
    if spec.init_from is None or claim.checkpoint is not None:
        return None
    with a.db.reader() as s:
        found = start_weights(s, job_id=spec.init_from, owner=claim.job.owner)
    if found is None:
        raise InvalidSpec(
            "init_from",
            f"job {spec.init_from} has no trained weights to start from (deleted, purged by "
            "retention, or not a succeeded job of this key)",
        )
    if found.model != spec.model:
        raise InvalidSpec(
            "init_from", f"job {spec.init_from} trained a {found.model}, not a {spec.model}"
        )
    return found.data


def _succeed(a: Attempt, rec: Recorder, result: TrainResult) -> dict[str, Any]:
    summary = result.summary()
    models = list(result.models.values())

    def store(s: Session) -> bool:
        return succeed_job(
            s, job_id=a.job_id, attempt=a.number,
            result=summary, record=result.record, models=models, weights=result.weights,
        )  # fmt: skip

    write = partial(a.write, store)  # retried through a database blip (worker.retry)
    said = {"result": summary}
    return finish(
        a, End(JobStatus.succeeded, result.steps, write, said, summary, told_by=rec.status)
    )


def _superseded(a: Attempt, rec: Recorder, e: JobSuperseded) -> dict[str, Any]:
    """A write found the job no longer this attempt's. It may be this attempt's own end,
    committed with its reply lost (the epoch that pruned it), then retried: if the row ended
    under this attempt, that end is told; otherwise another owns the job now."""
    try:
        with a.db.reader() as s:
            job = get_job(s, job_id=a.job_id)
    except SQLAlchemyError:
        job = None
    if job is not None and job.attempt == a.number and JobStatus(job.status).terminal:
        error = {"code": job.error_code, "message": job.error_message or ""}
        said = {"error": error if job.error_code else None}
        return finish(a, End(JobStatus(job.status), rec.last_step, event=said))
    log.warning("job %s: %s; stopping this attempt", a.job_id, e.message)
    return {"status": SUPERSEDED}


def _given_up(a: Attempt, e: DatabaseAway) -> dict[str, Any]:
    """The database stayed away: the row is left as it is, for the reconciler."""
    log.error(
        "job %s: attempt %d could not write to the database (%s); it stays running with "
        "its heartbeat stopped, and the reconciler requeues it from its last checkpoint",
        a.job_id,
        a.number,
        e,
    )
    return {"status": "lost"}


def _pruned(a: Attempt, rec: Recorder, e: TrialPruned) -> dict[str, Any]:
    """The trial already ended `pruned` with its last epoch (worker.recorder): tell it."""
    said = {"error": {"code": e.code, "message": e.message}}
    return finish(a, End(JobStatus.pruned, rec.last_step, None, said, said, why=e.message))


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
    (one transaction), and onto the queue at once, to resume at the next step elsewhere."""
    entry = f"{a.job_id}-p{a.number}"  # one preemption per attempt: a fresh entry id

    def write() -> bool:
        with a.db.writer() as s:
            return preempt_job(
                s, job_id=a.job_id, attempt=a.number, queue_entry=entry,
                epoch=e.epoch, step=e.step, steps=rec.unsaved, checkpoint=e.checkpoint,
            )  # fmt: skip

    end = End(
        JobStatus.queued, e.step, write, entry=entry, job=claim.job, then=rec.handed_back,
        result={"preempted_at_step": e.step}, why=f"preempted at step {e.step}",
    )  # fmt: skip
    return finish(a, end)


def _retry(
    a: Attempt, claim: Claim, rec: Recorder, e: TrainqError, max_restarts: int
) -> dict[str, Any]:
    """The machine could not check the exported model (its checking process was killed or
    ran out of time), or its disk was full: not the job's fault. The job goes back to the
    queue as a restart, to resume from its last checkpoint elsewhere; once its max_restarts
    are used up, it fails with the reason."""
    step = rec.last_step or claim.start_step
    rec.flush_history()
    if restarts_used(claim.job) >= max_restarts:  # job.attempt is this attempt's number
        return fail(a, step, e)
    entry = f"{a.job_id}-r{a.number}"

    def write() -> bool:
        with a.db.writer() as s:
            return retry_job(s, job_id=a.job_id, attempt=a.number, queue_entry=entry)

    end = End(
        JobStatus.queued, step, write, entry=entry, job=claim.job, result={"retried": e.code},
        why=f"restarted ({e.message})", level=logging.WARNING,
    )  # fmt: skip
    return finish(a, end)

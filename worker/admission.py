"""Admission: whether a queue entry this worker took may run, and the spec it trains. See
docs/jobs.md."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from core.db import Database, Job
from core.errors import InvalidSpec, TrainqError, WorkerVersionSkew, field_problems
from core.queue import VIA_API, enqueue_or_leave
from core.schema import database_revision, known_revisions
from core.spec import SPEC_VERSION, JobSpec, JobStatus, stored_spec, user_dataset_id
from core.store import create_job, end_job, get_dataset, get_job, set_queue_entry
from core.store.deletion import hold_job_id, lock_datasets, was_deleted
from worker.attempt import Attempt, fail

log = logging.getLogger("trainq.worker")
COMMIT_POLL_S = 0.05
SKEW_POLL_S = 0.1


def admit(a: Attempt) -> JobSpec | dict[str, Any]:
    """The spec to train, or the outcome of an entry refused: one naming no trainq job, one
    whose submission the API rolled back, or one whose spec or data set is refused (its
    job then ends failed)."""
    try:
        uuid.UUID(a.job_id)
    except ValueError:
        log.error("refusing job %r: trainq job ids are UUIDs", a.job_id)
        return {"status": JobStatus.failed, "error": "invalid job id"}
    if a.via == VIA_API and not _await_commit(a.db, a.job_id, a.settings.commit_wait_s):
        log.warning(
            "refusing queue entry %s: the API never committed job %s (its submission failed "
            "and the client was told so); nothing runs",
            a.queue_entry,
            a.job_id,
        )
        return {"status": "refused", "error": "the submission of this job failed"}
    admitted = _spec_of(a)
    if admitted is None:
        log.warning(
            "refusing queue entry %s: job %s has no row (it was deleted); nothing runs",
            a.queue_entry,
            a.job_id,
        )
        return {"status": "refused", "error": "the job of this entry was deleted"}
    spec, refused = admitted
    if isinstance(refused, WorkerVersionSkew):
        return _hand_back(a, refused)
    if spec is None or refused is not None:
        return fail(a, 0, refused or InvalidSpec("spec", "invalid"))
    return spec


def _spec_of(a: Attempt) -> tuple[JobSpec | None, TrainqError | None] | None:
    """The spec to train, or why none; None if the job was deleted. A job that has a row
    trains the row's spec for the row's owner: the database is the truth, a queue entry
    only its carrier. A job submitted straight to the queue gets its row here, from the
    entry. One transaction, holding the job's id (core.store.deletion.hold_job_id), reads
    the row, checks for a deletion and makes the row: a DELETE committed before it is seen,
    and one after it finds the row it read or made."""
    with a.db.writer() as s:
        hold_job_id(s, job_id=a.job_id)
        row = get_job(s, job_id=a.job_id)
        if row is not None:
            return _row_spec(s, a, row)
        if _deleted(s, a):
            return None
        return _new_row(s, a)


def _row_spec(s: Session, a: Attempt, row: Job) -> tuple[JobSpec | None, TrainqError | None]:
    if row.spec != a.raw_spec or row.owner != a.owner:
        log.warning(
            "queue entry %s carries a spec or owner other than job %s's row; the row's run",
            a.queue_entry,
            a.job_id,
        )
    spec, problem = _validate(row.spec, stored=True)
    if spec is not None:
        return spec, None
    skew = _version_skew(s, row)
    if skew is not None:
        return None, WorkerVersionSkew(f"{skew}; this worker cannot read its spec ({problem})")
    return None, InvalidSpec("spec", problem or "invalid")


def _version_skew(s: Session, row: Job) -> str | None:
    """Why a row this worker cannot read may be readable by another trainq, or None: it was
    written by code with another JobSpec, or the database was migrated past what this
    worker knows. Then the spec is not the user's fault."""
    if row.spec_version is not None and row.spec_version != SPEC_VERSION:
        return (
            f"the job was written with JobSpec version {row.spec_version}, "
            f"this worker has {SPEC_VERSION}"
        )
    revision = database_revision(s.connection())
    if revision is not None and revision not in known_revisions():
        return f"the database is at schema revision {revision}, which this worker does not know"
    return None


def _hand_back(a: Attempt, skew: WorkerVersionSkew) -> dict[str, Any]:
    """A job this worker cannot read, but another trainq could: back onto the queue under a
    fresh entry (`<job>-v<n>`: RQ would drop a second entry under the same id), for a
    worker of the API's own version; this worker then waits version_skew_pause_s before it
    takes work again, so that the others get to it first. The n-th hand-back past
    version_skew_hand_backs fails the job with the skew's own code, not as a bad spec."""
    n = _hand_backs(a)
    if n >= a.settings.version_skew_hand_backs:
        return fail(a, 0, skew)
    entry = f"{a.job_id}-v{n + 1}"
    with a.db.writer() as s:
        moved = set_queue_entry(s, job_id=a.job_id, queue_entry=entry, seen=a.queue_entry)
        job = get_job(s, job_id=a.job_id) if moved else None
    if job is None:
        log.info(
            "job %s is no longer queued under entry %s; not handing it back",
            a.job_id,
            a.queue_entry,
        )
        return {"status": "skipped"}
    enqueue_or_leave(a.r, a.settings, job, entry, what="handed back for version skew")
    log.warning("job %s handed back as %s: %s", a.job_id, entry, skew.message)
    _pause(a)
    return {"status": JobStatus.queued, "handed_back": skew.code}


def _hand_backs(a: Attempt) -> int:
    """How often the job was handed back for version skew in a row: its entry's number."""
    suffix = a.queue_entry.removeprefix(f"{a.job_id}-v")
    return int(suffix) if suffix != a.queue_entry and suffix.isdigit() else 0


def _pause(a: Attempt) -> None:
    """The horse keeps its worker busy for version_skew_pause_s (a stop request ends it)."""
    deadline = time.monotonic() + a.settings.version_skew_pause_s
    while time.monotonic() < deadline and not a.stop_asked():
        time.sleep(min(SKEW_POLL_S, max(0.0, deadline - time.monotonic())))


def _new_row(s: Session, a: Attempt) -> tuple[JobSpec | None, InvalidSpec | None]:
    """The row of a job submitted straight to the queue, from its entry. It may use an
    uploaded data set only if it is the entry's owner's (no owner: an admin's, any set)."""
    spec, problem = _validate(a.raw_spec)
    refused = InvalidSpec("spec", problem or "invalid") if spec is None else None
    if spec is not None and not _may_use(s, spec.dataset, a.owner):
        refused = InvalidSpec(
            "dataset",
            f"no data set {spec.dataset!r}: upload one with POST /datasets, or list yours "
            "with GET /datasets",
        )
    create_job(
        s,
        job_id=a.job_id,
        spec=spec or {"as_sent": a.raw_spec},
        owner=a.owner,
        queue_entry=a.queue_entry,
    )
    if refused is not None:  # ended with its row: no requeue ever runs it
        end_job(
            s,
            job_id=a.job_id,
            status=JobStatus.failed,
            code=refused.code,
            message=refused.message,
        )
    return spec, refused


def _may_use(s: Session, dataset: str, owner: str | None) -> bool:
    """Whether `owner` may train on `dataset`; another owner's set is refused exactly like a
    missing one, as the API does."""
    ds_id = user_dataset_id(dataset)
    if ds_id is None:
        return True
    # Held against deletion until the job's row is committed (core.store.deletion).
    if not lock_datasets(s, dataset_ids=[ds_id]):
        return False
    if owner is None:
        return True
    ds = get_dataset(s, dataset_id=ds_id)
    return ds is not None and ds.owner == owner


def _validate(raw: Any, *, stored: bool = False) -> tuple[JobSpec | None, str | None]:
    """A row's spec is read as it was stored (core.spec.stored_spec); a queue entry's, from
    another service, takes today's defaults for what it leaves out."""
    try:
        return (stored_spec(raw) if stored else JobSpec.model_validate(raw)), None
    except ValidationError as e:
        return None, "; ".join(field_problems(e))


def _deleted(s: Session, a: Attempt) -> bool:
    """Whether this entry's job, which has no row, was deleted (DELETE /jobs/{id}) after the
    entry was made: a worker took it just before the delete removed it. A requeue's entry
    (an id of its own) is made only for a job with a row, so its job's missing row says so
    too."""
    return a.queue_entry != a.job_id or was_deleted(s, job_id=a.job_id)


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

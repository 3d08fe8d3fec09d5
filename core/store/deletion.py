"""Deleting what an owner asks to be deleted: an ended job with everything stored of it, and
an uploaded data set that no queued or running job trains on. Each in the caller's one
transaction, so that a crash leaves all of it or none.
See docs/jobs.md ("Retention and deletion")."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from core.db import (
    Artifact,
    Checkpoint,
    DeletedJob,
    EpochMetric,
    Job,
    JobTag,
    ModelVersion,
    StepMetric,
    UserDataset,
    db_ago,
    lock_name,
)
from core.errors import JobRegistered
from core.spec import TERMINAL, USER_DATASET_PREFIX, JobStatus

ENDED = sorted(TERMINAL)
ACTIVE = [JobStatus.queued, JobStatus.running]
# What a job's row holds in other tables (each keyed to it, deleted before it).
RESULTS = (Artifact, Checkpoint, StepMetric, EpochMetric, JobTag)
DELETED_JOB_DAYS = 7  # how long a deleted job's id is remembered (worker.admission)


def delete_ended_job(s: Session, *, job_id: str) -> bool:
    """The job's row, model, checkpoint, step and epoch rows, if the job has ended; False
    (nothing deleted) if it is queued or running, or gone. A terminal status never reverts
    and nothing writes to an ended job, so the check cannot go stale before the commit.
    JobRegistered if its model is a registered model's version (core.store.registry holds
    the job's id too while it registers one)."""
    hold_job_id(s, job_id=job_id)
    status = s.scalar(select(Job.status).where(Job.id == job_id))
    if status not in ENDED:
        return False
    versions = select(ModelVersion.version).where(ModelVersion.job_id == job_id)
    if s.scalar(versions.limit(1)) is not None:
        raise JobRegistered(
            f"job {job_id} was registered as a model's version meanwhile: delete that "
            "version first (DELETE /models/{name}/versions/{n})"
        )
    for table in RESULTS:
        s.execute(delete(table).where(table.job_id == job_id))
    s.execute(delete(Job).where(Job.id == job_id))
    s.execute(delete(DeletedJob).where(DeletedJob.deleted_at < db_ago(DELETED_JOB_DAYS * 86400)))
    s.add(DeletedJob(id=job_id))
    return True


def hold_job_id(s: Session, *, job_id: str) -> None:
    """Hold the job's id until this transaction ends. A deletion of the job and a worker that
    reads or makes the job's row for a queue entry (worker.admission) each hold it before
    they read: whichever comes second sees what the first committed, so a worker never
    makes again a job just deleted (the row is gone, but its deleted_jobs record is there)."""
    lock_name(s, f"trainq-job:{job_id}")


def was_deleted(s: Session, *, job_id: str) -> bool:
    return s.get(DeletedJob, job_id) is not None


def lock_datasets(s: Session, *, dataset_ids: Iterable[str]) -> set[str]:
    """Which of these uploaded data sets exist, each held against deletion until the caller
    commits: on PostgreSQL a shared row lock (delete_unused_dataset's exclusive one waits
    for it, and then sees the job this transaction wrote); on SQLite the transaction holds
    the database's one write lock already."""
    wanted = sorted(set(dataset_ids))
    if not wanted:
        return set()
    rows = s.scalars(
        select(UserDataset.id).where(UserDataset.id.in_(wanted)).with_for_update(read=True)
    )
    return set(rows)


def jobs_using(s: Session, *, dataset_id: str, limit: int = 5) -> list[str]:
    """Queued or running jobs that train on the uploaded data set (a few, to name them)."""
    named = Job.spec["dataset"].as_string() == f"{USER_DATASET_PREFIX}{dataset_id}"
    return list(s.scalars(select(Job.id).where(Job.status.in_(ACTIVE), named).limit(limit)))


def delete_unused_dataset(s: Session, *, dataset_id: str) -> list[str]:
    """Delete the data set unless a queued or running job trains on it; the ids of such
    jobs (nothing deleted) otherwise. The row is locked first (PostgreSQL: FOR UPDATE), so a
    submission naming the set either committed its job before (and is seen here) or waits
    and then finds the set gone (lock_datasets)."""
    s.execute(select(UserDataset.id).where(UserDataset.id == dataset_id).with_for_update())
    users = jobs_using(s, dataset_id=dataset_id)
    if not users:
        s.execute(delete(UserDataset).where(UserDataset.id == dataset_id))
    return users

"""The job row: creating and finding jobs, and the named moves of its status (each one a
call of core.store.lifecycle.move). See docs/jobs.md."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from sqlalchemy import Select, bindparam, insert, select, update
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from core.db import DbTime, Job, JobTag, Sweep, db_now, utcnow
from core.errors import JobSuperseded
from core.labels import Labels, name_key
from core.spec import SPEC_VERSION, TERMINAL, JobSpec, JobStatus, Priority
from core.store.lifecycle import move, requeued, running_attempt, updated

Q = TypeVar("Q", bound=Select[Any])


def spec_hash(spec: Any) -> str:
    """sha256 of the canonical JSON of a spec (validated or, from the queue, raw)."""
    if isinstance(spec, JobSpec):
        spec = spec.model_dump(mode="json")
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def create_job(
    s: Session,
    *,
    job_id: str,
    spec: JobSpec | dict[str, Any],
    owner: str | None,
    idempotency_key: str | None = None,
    queue_entry: str | None = None,
    labels: Labels | None = None,
) -> Job:
    """A queued job. `spec` is raw JSON only for a job that came straight from the queue with
    a spec that did not validate: it is kept as sent, and the job is failed at once."""
    job = new_job(
        job_id=job_id, spec=spec, owner=owner, idempotency_key=idempotency_key, labels=labels
    )
    if queue_entry is not None:
        job.queue_entry = queue_entry
    s.add(job)
    s.flush()
    rows = tag_rows(job)
    if rows:
        s.execute(insert(JobTag), rows)
    return job


def new_job(
    *,
    job_id: str,
    spec: JobSpec | dict[str, Any],
    owner: str | None,
    idempotency_key: str | None,
    labels: Labels | None = None,
) -> Job:
    """A queued job, not yet in any session (create_job, or insert_jobs for many). Its
    enqueued_at is the database's clock at the insert (the column's default)."""
    labels = labels or Labels()
    dataset, model = _searched(spec)
    return Job(
        id=job_id,
        owner=owner,
        status=JobStatus.queued,
        spec=spec.model_dump(mode="json") if isinstance(spec, JobSpec) else spec,
        idempotency_key=idempotency_key,
        request_hash=spec_hash(spec),
        created_at=utcnow(),
        attempt=0,
        preemptions=0,
        queue_entry=job_id,
        spec_version=SPEC_VERSION,
        priority=_rank(spec),
        progress_step=0,
        progress_epoch=0,
        cancel_requested=False,
        name=labels.name,
        name_key=name_key(labels.name),
        notes=labels.notes,
        tags=list(labels.tags),
        dataset=dataset,
        model=model,
    )


def _searched(spec: JobSpec | dict[str, Any]) -> tuple[str | None, str | None]:
    """The data set and architecture GET /jobs filters by, from the spec (a raw one, as
    migration 0016 reads stored specs: a spec without `model` trains the cnn)."""
    if isinstance(spec, JobSpec):
        return spec.dataset, spec.model.value
    dataset, model = spec.get("dataset"), spec.get("model", "cnn")
    return (
        dataset[:64] if isinstance(dataset, str) else None,
        model[:32] if isinstance(model, str) else None,
    )


def tag_rows(job: Job, tags: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The job_tags rows (for insert(JobTag)) of `tags`, by default all the job's: what the
    search finds it by, each with the job's owner and creation time."""
    chosen = (job.tags or ()) if tags is None else tags
    return [
        {"job_id": job.id, "tag": tag, "owner": job.owner, "created_at": job.created_at}
        for tag in chosen
    ]


def _rank(spec: JobSpec | dict[str, Any]) -> int:
    if isinstance(spec, JobSpec):
        return spec.priority.rank
    raw = spec.get("priority")
    return Priority(str(raw)).rank if raw in Priority.__members__ else 0


def insert_jobs(s: Session, *, jobs: Sequence[Job]) -> None:
    """Insert new jobs (from new_job) in one statement; the objects stay outside the session.
    Much cheaper than the ORM's unit of work for a batch of submissions."""
    columns = [c.key for c in Job.__table__.columns]
    rows = [{k: job.__dict__[k] for k in columns if k in job.__dict__} for job in jobs]
    s.execute(insert(Job), rows)
    tags = [row for job in jobs for row in tag_rows(job)]
    if tags:
        s.execute(insert(JobTag), tags)


def get_job(s: Session, *, job_id: str) -> Job | None:
    return s.get(Job, job_id)


def newest_first(q: Q, model: type[Job | Sweep], before: tuple[str, str] | None, limit: int) -> Q:
    """A listing's page, newest first: `before` is the (created_at iso, id) of the previous
    page's last item (api.cursors)."""
    if before is not None:
        created, last_id = before
        ts = dt.datetime.fromisoformat(created)
        q = q.where((model.created_at < ts) | ((model.created_at == ts) & (model.id < last_id)))
    return q.order_by(model.created_at.desc(), model.id.desc()).limit(limit)


# Built once: executed on the session's connection, the most polled read skips the ORM and
# most of the statement compilation.
_JOB_ACCESS = select(Job.owner, Job.status).where(Job.id == bindparam("job_id"))


def job_access(s: Session, *, job_id: str) -> Row[str | None, str] | None:
    """A job's owner and status (what a cheap access check needs), or None."""
    return s.connection().execute(_JOB_ACCESS, {"job_id": job_id}).one_or_none()


def claim_job(
    s: Session, *, job_id: str, worker: str, device: str, queue_entry: str | None = None
) -> Job | None:
    """queued -> running, attempt + 1. None if the job is not queued: canceled before it
    started, already running elsewhere or finished (a duplicate delivery runs nothing).
    `queue_entry`, the entry a worker runs: the claim holds only if the row names it
    (lifecycle.entry_named); without it (no queue involved), no entry is checked."""
    if not move(s, job_id, JobStatus.running, entry=queue_entry, worker=worker, device=device):
        return None
    job = s.get(Job, job_id)
    if job is not None:
        s.refresh(job)
    return job


def fence(s: Session, job_id: str, attempt: int, **values: Any) -> None:
    """Every write of a running attempt goes through here, first: it proves the attempt
    still owns the job (and beats its heartbeat), or raises JobSuperseded. Being first, it
    takes the job row's lock (PostgreSQL; on SQLite the transaction holds the write lock
    from BEGIN IMMEDIATE): a reconciler's requeue or end of the job waits for the commit,
    then checks the heartbeat again."""
    if not updated(s, running_attempt(job_id, attempt).values(heartbeat_at=db_now(), **values)):
        raise JobSuperseded(f"attempt {attempt} of job {job_id} no longer owns it")


def heartbeat(s: Session, *, job_id: str, attempt: int) -> bool:
    """Beat, and say whether a cancel was asked for (the database's word, for when Redis is
    away)."""
    fence(s, job_id, attempt)
    return bool(s.scalar(select(Job.cancel_requested).where(Job.id == job_id)))


def record_stop_request(s: Session, *, job_id: str, attempt: int) -> None:
    """The attempt's worker was asked to stop (worker.reconciler counts its loss, should it
    die before it hands the job back, as a preemption). Not a heartbeat: a stalled attempt
    stays silent."""
    s.execute(running_attempt(job_id, attempt).values(stop_requested_attempt=attempt))


def set_total_steps(s: Session, *, job_id: str, attempt: int, total_steps: int) -> None:
    fence(s, job_id, attempt, total_steps=total_steps)


def end_job(
    s: Session,
    *,
    job_id: str,
    status: JobStatus,
    code: str | None = None,
    message: str | None = None,
    from_statuses: Sequence[JobStatus] | None = None,
    attempt: int | None = None,
    silent_since: DbTime | None = None,
) -> bool:
    """Move a job to a terminal status from `from_statuses` (None: every status the move is
    declared from, lifecycle.TRANSITIONS), unless it already ended (or, with `attempt`,
    unless another attempt owns it now; with `silent_since`, unless it beat since then: a
    lost job seen in a stale read). True if it moved; its checkpoint then goes in the same
    transaction: a terminal status never reverts, so nothing will resume from it."""
    if status not in TERMINAL:
        raise ValueError(f"{status} is not a terminal status")
    return move(
        s, job_id, status, sources=from_statuses, attempt=attempt, silent_since=silent_since,
        error_code=code, error_message=message,
    )  # fmt: skip


def lost_jobs(s: Session, *, silent_since: DbTime) -> Sequence[Job]:
    """Running jobs whose training loop has not written a heartbeat since `silent_since`
    (the reconciler's: db_ago(heartbeat timeout))."""
    return s.scalars(
        select(Job).where(Job.status == JobStatus.running, Job.heartbeat_at < silent_since)
    ).all()


def requeue_job(
    s: Session,
    *,
    job_id: str,
    attempt: int,
    queue_entry: str,
    silent_since: DbTime,
    preempted: bool = False,
) -> bool:
    """A lost attempt's job goes back to queued (it resumes from its last checkpoint). Only
    one reconciler wins: the update is guarded by the attempt it saw, and by the attempt
    still being silent since `silent_since` (one that beat after the read is alive).
    `preempted`: its worker had been asked to stop, so the loss counts as a preemption."""
    return move(
        s, job_id, JobStatus.queued, attempt=attempt, silent_since=silent_since,
        **requeued(queue_entry, preempted),
    )  # fmt: skip


def retry_job(s: Session, *, job_id: str, attempt: int, queue_entry: str) -> bool:
    """A running attempt that met trouble of its machine's, not of the job's, hands the job
    back: running -> queued, as a restart (it counts against max_restarts). It resumes from
    its last checkpoint. False if the attempt no longer owns the job."""
    return move(s, job_id, JobStatus.queued, attempt=attempt, **requeued(queue_entry, False))


def stale_queued_jobs(s: Session, *, enqueued_before: DbTime) -> Sequence[Job]:
    return s.scalars(
        select(Job).where(Job.status == JobStatus.queued, Job.enqueued_at < enqueued_before)
    ).all()


IDS_PER_QUERY = 500  # ids in one IN (...): within SQLite's bound on parameters


def accepted_entries(s: Session, *, job_ids: Collection[str]) -> dict[str, str | None]:
    """Each of these jobs that has a row: the queue entry its claim accepts
    (lifecycle.entry_named), or None when it is not queued and accepts none."""
    ordered = sorted(job_ids)
    out: dict[str, str | None] = {}
    for i in range(0, len(ordered), IDS_PER_QUERY):
        q = select(Job.id, Job.status, Job.queue_entry).where(
            Job.id.in_(ordered[i : i + IDS_PER_QUERY])
        )
        for row in s.execute(q):
            waits = row.status == JobStatus.queued
            out[row.id] = (row.queue_entry or row.id) if waits else None
    return out


def set_queue_entry(s: Session, *, job_id: str, queue_entry: str, seen: str | None) -> bool:
    return updated(
        s,
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued, Job.queue_entry == seen)
        .values(queue_entry=queue_entry, enqueued_at=db_now()),
    )


def request_cancel(s: Session, *, job_id: str) -> JobStatus | None:
    """queued -> canceled at once; running -> flagged (the worker stops within a few steps).
    Returns the status after the call, or None if the job had already ended."""
    if end_job(
        s,
        job_id=job_id,
        status=JobStatus.canceled,
        code="canceled",
        message="canceled before it started",
        from_statuses=(JobStatus.queued,),
    ):
        return JobStatus.canceled
    flagged = updated(
        s,
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.running)
        .values(cancel_requested=True),
    )
    return JobStatus.running if flagged else None

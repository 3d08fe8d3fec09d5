"""What the /jobs routes do: a job as the API shows it, a submission and its answer again
(Idempotency-Key), a page of metrics, a cancel. See docs/jobs.md."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError
from sqlalchemy.orm import Session

from api.access import no_dataset, visible_status
from api.auth import Caller
from api.cancels import announce_cancel, canceled
from api.formats import default_format, offered_formats
from api.job_queries import JobQuery
from api.reads import read
from api.schemas import METRIC_FIELDS, ConfusionOut, JobOut, JobPage
from api.services.idempotency import answer_again
from api.services.submitter import Outcome, Submitter
from core.config import Settings
from core.db import Database, Job, as_utc
from core.errors import AlreadyEnded, DatasetGone, InvalidRequest, NoRecord, NotFound
from core.labels import Labels, LabelsPatch
from core.spec import ExportFormat, JobSpec, JobStatus
from core.store import epoch_of, request_cancel, spec_hash, step_rows
from core.store.labels import relabel_job
from core.store.search import Scope, position_of, search_jobs
from core.stream import STEP, EntryId, aread, latest_step
from core.sweeps.trials import advance

log = logging.getLogger("trainq.api")


def job_out(job: Job, caller: Caller, r: Redis | None = None) -> JobOut:
    """The job as GET /jobs/{id} answers it; with `r`, a running job's step is the live one."""
    step = job.progress_step
    offered = offered_formats(job)
    if r is not None and job.status == JobStatus.running:
        step = max(step, latest_step(r, job.id))
    return JobOut.model_validate(
        {
            "id": job.id,
            "status": job.status,
            "name": job.name,
            "tags": job.tags or [],
            "notes": job.notes,
            "spec": job.spec,
            "created_at": as_utc(job.created_at),
            "started_at": as_utc(job.started_at),
            "finished_at": as_utc(job.finished_at),
            "purged_at": as_utc(job.purged_at),
            "attempt": job.attempt,
            # A worker's name carries its host's: a thing for admins, not for every key.
            "worker": job.worker if caller.admin else None,
            "device": job.device,
            "progress": {
                "step": step,
                "total_steps": job.total_steps,
                "epoch": job.progress_epoch,
            },
            "result": job.result,
            "sweep": _sweep_of(job),
            "error": _error_of(job),
            "formats": offered,
            "default_format": default_format(job),
            "links": _links(job.id, offered),
        }
    )


def _sweep_of(job: Job) -> dict[str, Any] | None:
    if not job.sweep_id:
        return None
    return {
        "id": job.sweep_id,
        "trial": job.trial_number,
        "params": job.trial_params or {},
        "link": f"/sweeps/{job.sweep_id}",
    }


def _error_of(job: Job) -> dict[str, Any] | None:
    if not job.error_code:
        return None
    return {"code": job.error_code, "message": job.error_message or ""}


def _links(job_id: str, offered: list[ExportFormat]) -> dict[str, Any]:
    base = f"/jobs/{job_id}"
    return {
        "self": base,
        "metrics": f"{base}/metrics",
        "epochs": f"{base}/epochs",
        "events": f"{base}/events",
        "model": f"{base}/model",
        "models": {f: f"{base}/model?format={f}" for f in offered},
        "record": f"{base}/record",
        "cancel": f"{base}/cancel",
    }


async def submit(
    submitter: Submitter,
    spec: JobSpec,
    labels: Labels,
    caller: Caller,
    idempotency_key: str | None,
) -> Outcome:
    """The job and whether this submission made it (api.services.submitter); its data set
    deleted since the route checked it is the same 422 as one never there."""
    try:
        return await submitter.submit(
            spec,
            owner=caller.owner,
            idempotency_key=idempotency_key,
            quota_owner=caller.quota_owner,
            labels=labels,
        )
    except DatasetGone as e:  # deleted between the route's look-up and the row's insert
        raise InvalidRequest([no_dataset(spec)]) from e


async def answer_again_async(job: Job, spec: JobSpec, caller: Caller, r: Redis) -> JSONResponse:
    """A submission whose Idempotency-Key found its job: in the thread pool for its blocking
    Redis read (the live step); no database read."""

    def again() -> JSONResponse:
        def body() -> dict[str, Any]:
            return job_out(job, caller, r).model_dump(mode="json")

        return answer_again(job, spec_hash(spec), body, what="job spec", noun="job")

    return await run_in_threadpool(again)


async def metrics_page(
    db: Database, ar: AsyncRedis, caller: Caller, job_id: str, after: int, limit: int
) -> str:
    """The page of steps after `after` as JSON text: the database's for finished epochs,
    then the live stream's, in order and without a gap."""
    status, items = await read(db, _stored_steps, caller, job_id, after, limit)
    cursor = items[-1]["step"] if items else after
    if len(items) < limit:
        # Newer steps than the database holds: the live stream (steps only, in order).
        live = await aread(ar, job_id, EntryId(cursor, STEP), count=2 * (limit - len(items)))
        for _, kind, data in live:
            if kind != "step":
                continue
            if data["step"] != cursor + 1:
                break  # a gap (the stream was trimmed or lost): stop, never skip a step
            items.append({k: data[k] for k in METRIC_FIELDS})
            cursor += 1
            if len(items) == limit:
                break
    return json.dumps({"items": items, "next": cursor, "status": status})


def _stored_steps(
    session: Session, caller: Caller, job_id: str, after: int, limit: int
) -> tuple[str, list[dict[str, Any]]]:
    status = visible_status(session, caller, job_id)
    return status, step_rows(session, job_id=job_id, after=after, limit=limit)


def find(session: Session, caller: Caller, query: JobQuery, limit: int) -> JobPage:
    """A page of the caller's jobs (an admin's: everyone's) that `query` finds."""
    found = search_jobs(
        session,
        scope=Scope(caller.owner, everyone=caller.admin),
        filters=query.filters,
        sort=query.sort,
        after=query.after,
        limit=limit + 1,
    )
    page = list(found[:limit])
    more = len(found) > limit
    nxt = query.cursor(position_of(page[-1], query.sort)) if more else None
    return JobPage(items=[job_out(j, caller) for j in page], next=nxt)


def relabel(session: Session, job: Job, patch: LabelsPatch) -> Job:
    """The job renamed, tagged or annotated as `patch` says, committed."""
    changed = relabel_job(session, job_id=job.id, patch=patch)
    if changed is None:  # deleted since it was looked up
        raise NotFound(f"no job {job.id}")
    session.commit()
    return changed


def cancel(session: Session, r: Redis, job: Job) -> JobStatus:
    """Cancel the job (AlreadyEnded if it has ended) and tell Redis. Committed, so the
    answer is 202 whatever Redis does then: a running attempt also reads the flag from the
    database with its heartbeat, and followers close on the database's word when the
    stream has no end."""
    outcome = request_cancel(session, job_id=job.id)
    if outcome is None:
        raise AlreadyEnded(f"job {job.id} already ended ({job.status})")
    note = canceled(session, job, outcome)
    session.commit()
    try:
        announce_cancel(r, note)
    except RedisError as e:
        log.warning("job %s: canceled, but Redis was not told: %s", job.id, e)
    return outcome


def next_trial(db: Database, r: Redis, settings: Settings, sweep_id: str) -> None:
    """A queued trial canceled: its sweep asks for the next one now (else the reconciler's
    next pass does)."""
    try:
        advance(db, r, settings, sweep_id=sweep_id)
    except Exception as e:  # the cancel stands; the reconciler tops the sweep up
        log.warning("sweep %s: next trial left to the reconciler: %s", sweep_id, e)


def record_for(job: Job, caller: Caller) -> dict[str, Any]:
    """The job's run record; the host names one of our machines: admins alone see it."""
    if job.record is None:
        raise NoRecord(f"job {job.id} is {job.status}: no run record yet")
    if caller.admin:
        return job.record
    return {k: v for k, v in job.record.items() if k != "host"}


def class_figures(session: Session, job: Job, epoch: int | None) -> ConfusionOut:
    """An epoch's confusion matrix and per-class figures: `epoch`'s, or the last one's."""
    row = epoch_of(session, job_id=job.id, epoch=epoch)
    which = "no epoch yet" if epoch is None else f"no epoch {epoch}"
    if row is None or not row.class_metrics:
        if row is not None:
            which = f"epoch {row.epoch} was stored without class figures"
        raise NotFound(f"job {job.id}: {which}")
    figures = row.class_metrics
    return ConfusionOut(
        epoch=row.epoch,
        classes=figures["classes"],
        confusion=figures["confusion"],
        class_counts=[sum(r) for r in figures["confusion"]],
        per_class_accuracy=figures["per_class_accuracy"],
        top5_accuracy=figures["top5_accuracy"],
        test_accuracy=row.test_accuracy,
    )

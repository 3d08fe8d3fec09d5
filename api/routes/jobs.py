"""/jobs: submit, list, inspect, follow, cancel, download."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.orm import Session

from api.access import IdPrefix, check_dataset, no_dataset, visible_job, visible_status
from api.auth import Caller
from api.cancels import announce_cancel
from api.cursors import decode_cursor, encode_cursor
from api.deletion import delete_job
from api.deps import AsyncRedisDep, CallerDep, ReaderDep, RedisDep, SessionDep, read
from api.downloads import DownloadResponse, staged_model
from api.errors import RETRY_AFTER_S
from api.events import EventStreamResponse, follow_events
from api.formats import (
    MEDIA_TYPES,
    asked_formats,
    default_format,
    filename,
    not_offered,
    offered_formats,
)
from api.schemas import (
    METRIC_FIELDS,
    QUOTA_REFUSAL,
    EpochOut,
    JobOut,
    JobPage,
    MetricPage,
    Problem,
    QuotaProblem,
)
from api.services.submitter import OutcomeUnknown, Submitter
from api.slots import KeySlots
from core.config import Settings
from core.db import Job, as_utc
from core.errors import DatasetGone, ModelPurged
from core.spec import ExportFormat, JobSpec, JobStatus, user_dataset_id
from core.store import (
    epoch_metrics,
    get_artifact,
    list_jobs,
    request_cancel,
    spec_hash,
    step_rows,
)
from core.stream import MAX_STEP, STEP, EntryId, aread, latest_step
from core.sweeps.trials import advance
from core.text import PLAIN_PATTERN

log = logging.getLogger("trainq.api")

router = APIRouter(prefix="/jobs", tags=["jobs"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "Missing or unknown API key."},
    404: {"model": Problem, "description": "No such job (or not yours)."},
}
JobId = Annotated[uuid.UUID, "a job id"]


def job_out(job: Job, caller: Caller, r: Redis | None = None) -> JobOut:
    step = job.progress_step
    if r is not None and job.status == JobStatus.running:
        step = max(step, latest_step(r, job.id))
    base = f"/jobs/{job.id}"
    offered = offered_formats(job)
    return JobOut.model_validate(
        {
            "id": job.id,
            "status": job.status,
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
            "sweep": (
                {
                    "id": job.sweep_id,
                    "trial": job.trial_number,
                    "params": job.trial_params or {},
                    "link": f"/sweeps/{job.sweep_id}",
                }
                if job.sweep_id
                else None
            ),
            "error": (
                {"code": job.error_code, "message": job.error_message or ""}
                if job.error_code
                else None
            ),
            "formats": offered,
            "default_format": default_format(job),
            "links": {
                "self": base,
                "metrics": f"{base}/metrics",
                "epochs": f"{base}/epochs",
                "events": f"{base}/events",
                "model": f"{base}/model",
                "models": {f: f"{base}/model?format={f}" for f in offered},
                "record": f"{base}/record",
                "cancel": f"{base}/cancel",
            },
        }
    )


@router.post(
    "",
    status_code=201,
    response_model=JobOut,
    responses={
        **ERRORS,
        200: {"model": JobOut, "description": "Same Idempotency-Key and body: the same job."},
        409: {"model": Problem, "description": "Idempotency-Key reused with another body."},
        422: {"description": "Invalid spec; `detail[].loc` names the field."},
        429: {"model": QuotaProblem, "description": QUOTA_REFUSAL},
        503: {"model": Problem, "description": "Queue or database unavailable."},
    },
    summary="Submit a training job",
)
async def submit_job(
    spec: JobSpec,
    request: Request,
    response: Response,
    caller: CallerDep,
    idempotency_key: Annotated[str | None, Header(max_length=200, pattern=PLAIN_PATTERN)] = None,
) -> Any:
    if user_dataset_id(spec.dataset) is not None:
        await read(request.app.state.db, check_dataset, caller, spec)
    submitter: Submitter = request.app.state.submitter
    try:
        job, created = await submitter.submit(
            spec,
            owner=caller.owner,
            idempotency_key=idempotency_key,
            quota_owner=caller.quota_owner,
        )
    except OutcomeUnknown as e:
        raise HTTPException(503, detail=str(e), headers={"Retry-After": RETRY_AFTER_S}) from e
    except DatasetGone as e:  # deleted between the look-up above and the row's insert
        raise HTTPException(422, detail=[no_dataset(spec)]) from e
    if not created:
        # In the thread pool for its blocking Redis read (the live step); no database read.
        return await run_in_threadpool(_replay, job, spec, caller, request.app.state.redis)
    response.headers["Location"] = f"/jobs/{job.id}"
    return job_out(job, caller)


def _replay(existing: Job, spec: JobSpec, caller: Caller, r: Redis) -> JSONResponse:
    if existing.request_hash != spec_hash(spec):
        raise HTTPException(
            409,
            detail="this Idempotency-Key was already used with a different job spec; "
            "use a new key for a new job",
        )
    return JSONResponse(
        job_out(existing, caller, r).model_dump(mode="json"),
        status_code=200,
        headers={"Location": f"/jobs/{existing.id}"},
    )


@router.get("", response_model=JobPage, responses=ERRORS, summary="List jobs, newest first")
def get_jobs(
    session: ReaderDep,
    caller: CallerDep,
    status: JobStatus | None = None,
    sweep_id: Annotated[uuid.UUID | None, Query(description="Only this sweep's trials.")] = None,
    id_prefix: IdPrefix = None,
    cursor: Annotated[str | None, Query(max_length=200, pattern=PLAIN_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> JobPage:
    before = decode_cursor(cursor) if cursor else None
    jobs = list_jobs(
        session,
        owner=caller.owner,
        all_owners=caller.admin,
        status=status,
        sweep_id=str(sweep_id) if sweep_id else None,
        id_prefix=id_prefix.lower() if id_prefix else None,
        before=before,
        limit=limit + 1,
    )
    page = list(jobs[:limit])
    nxt = encode_cursor(page[-1].created_at, page[-1].id) if len(jobs) > limit else None
    return JobPage(items=[job_out(j, caller) for j in page], next=nxt)


@router.get("/{job_id}", response_model=JobOut, responses=ERRORS, summary="One job")
def get_one(job_id: JobId, session: ReaderDep, r: RedisDep, caller: CallerDep) -> JobOut:
    return job_out(visible_job(session, caller, job_id), caller, r)


@router.get(
    "/{job_id}/metrics",
    response_model=MetricPage,
    response_class=JSONResponse,
    responses=ERRORS,
    summary="Per-step metrics after a cursor",
    description="Every training step exactly once, in order: from the database for finished "
    "epochs and from the live Redis stream for the rest. Pass `next` back as `after`.",
)
async def get_metrics(
    job_id: JobId,
    request: Request,
    ar: AsyncRedisDep,
    caller: CallerDep,
    after: Annotated[int, Query(ge=0, le=MAX_STEP)] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> Response:
    # The most polled route: plain rows instead of ORM objects, and the page serialised once.
    status, items = await read(
        request.app.state.db, _stored_steps, caller, str(job_id), after, limit
    )
    cursor = items[-1]["step"] if items else after
    if len(items) < limit:
        # Newer steps than the database holds: the live stream (steps only, in order).
        live = await aread(ar, str(job_id), EntryId(cursor, STEP), count=2 * (limit - len(items)))
        for _, kind, data in live:
            if kind != "step":
                continue
            if data["step"] != cursor + 1:
                break  # a gap (the stream was trimmed or lost): stop, never skip a step
            items.append({k: data[k] for k in METRIC_FIELDS})
            cursor += 1
            if len(items) == limit:
                break
    page = {"items": items, "next": cursor, "status": status}
    return Response(json.dumps(page), media_type="application/json")


def _stored_steps(
    session: Session, caller: Caller, job_id: str, after: int, limit: int
) -> tuple[str, list[dict[str, Any]]]:
    status = visible_status(session, caller, job_id)
    return status, step_rows(session, job_id=job_id, after=after, limit=limit)


@router.get(
    "/{job_id}/epochs", response_model=list[EpochOut], responses=ERRORS, summary="Per-epoch"
)
def get_epochs(job_id: JobId, session: ReaderDep, caller: CallerDep) -> list[EpochOut]:
    job = visible_job(session, caller, job_id)
    return [
        EpochOut.model_validate(e, from_attributes=True)
        for e in epoch_metrics(session, job_id=job.id)
    ]


@router.get(
    "/{job_id}/events",
    response_class=EventStreamResponse,
    status_code=200,  # the class takes no status_code, so OpenAPI cannot read it from there
    responses={
        **ERRORS,
        200: {"content": {"text/event-stream": {}}},
        429: {
            "model": Problem,
            "description": "Too many event streams open at once, for this key or this API "
            "process: `limit` names the setting, `allowed` its value; see Retry-After.",
        },
    },
    summary="Server-Sent Events: steps, epoch ends, status changes",
    description="Resumable with `Last-Event-ID`; the stream ends when the job ends. A "
    "follower that reads slower than the job trains gets a `lagging` event, keyed with the "
    "last entry it was sent, and the stream closes: reconnect with that Last-Event-ID.",
)
async def get_events(
    job_id: JobId,
    request: Request,
    ar: AsyncRedisDep,
    caller: CallerDep,
    last_event_id: Annotated[str | None, Header(max_length=64, pattern=PLAIN_PATTERN)] = None,
) -> EventStreamResponse:
    db = request.app.state.db
    await read(db, visible_status, caller, str(job_id))
    hub = request.app.state.events
    return follow_events(hub, db, ar, caller.owner, str(job_id), last_event_id)


@router.post(
    "/{job_id}/cancel",
    response_model=JobOut,
    status_code=202,
    responses={**ERRORS, 409: {"model": Problem, "description": "The job already ended."}},
    summary="Cancel a job",
    description="Queued: it never runs. Running: it stops within a few batches. Both end "
    "`canceled`.",
)
def cancel(
    job_id: JobId, request: Request, session: SessionDep, r: RedisDep, caller: CallerDep
) -> JobOut:
    job = visible_job(session, caller, job_id)
    outcome = request_cancel(session, job_id=job.id)
    if outcome is None:
        raise HTTPException(409, detail=f"job {job.id} already ended ({job.status})")
    session.commit()
    session.refresh(job)
    # Committed, so the answer is 202 whatever Redis does now: a running attempt also reads
    # the flag from the database with its heartbeat, and followers close on the database's
    # word when the stream has no end.
    try:
        announce_cancel(r, job, outcome)
    except RedisError as e:
        log.warning("job %s: canceled, but Redis was not told: %s", job.id, e)
    out = job_out(job, caller)
    if job.sweep_id and outcome is JobStatus.canceled:
        session.close()  # on SQLite it holds the one write lock the next trial needs
        _next_trial(request, r, job.sweep_id)
    return out


def _next_trial(request: Request, r: Redis, sweep_id: str) -> None:
    """A queued trial canceled: its sweep asks for the next one now (else the reconciler's
    next pass does)."""
    try:
        advance(request.app.state.db, r, request.app.state.settings, sweep_id=sweep_id)
    except Exception as e:  # the cancel stands; the reconciler tops the sweep up
        log.warning("sweep %s: next trial left to the reconciler: %s", sweep_id, e)


@router.delete(
    "/{job_id}",
    status_code=204,
    responses={
        **ERRORS,
        409: {"model": Problem, "description": "Queued or running: cancel it first."},
    },
    summary="Delete an ended job",
    description="Its model, checkpoint, step and epoch metrics, live stream and record all "
    "go; the job answers 404 from then on. A queued or running job is refused with 409: "
    "cancel it first.",
)
def delete_one(job_id: JobId, request: Request, session: ReaderDep, caller: CallerDep) -> Response:
    job = visible_job(session, caller, job_id)
    session.close()  # the deletion's own transaction follows; this read holds nothing
    state = request.app.state
    delete_job(state.db, state.redis, queue=state.settings.queue, job=job)
    return Response(status_code=204)


@router.api_route(
    "/{job_id}/model",
    methods=["GET", "HEAD"],
    responses={
        **ERRORS,
        200: {
            "content": {t: {} for t in dict.fromkeys(MEDIA_TYPES.values())},
            "description": "The model file: TorchScript (.pt), torch.export (.pt2) or ONNX "
            "(.onnx); without ?format=, the job's `default_format`. Its ETag is its sha256.",
        },
        304: {"description": "If-None-Match holds the ETag: the file has not changed."},
        409: {
            "model": Problem,
            "description": "The job has not succeeded (yet), or offers no model in this "
            "format: the detail says why (not asked for in its spec, or failed its check).",
        },
        410: {
            "model": Problem,
            "description": "The retention policy removed the job's model (`purged_at`).",
        },
        422: {"description": "Unknown format."},
        429: {
            "model": QuotaProblem,
            "description": "Too many downloads open at once, for this key or this API process "
            "(download_max_per_key, download_max_per_process), with Retry-After.",
        },
    },
    summary="Download the model (TorchScript, pt2 or ONNX)",
    description="Each format is its own file with its own sha256 ETag; the job's "
    "`links.models` lists those it offers. Every format takes float32 images (N, C, H, W) "
    "in [0, 1] and returns logits (N, classes); any batch size.",
)
def get_model(
    job_id: JobId,
    request: Request,
    session: ReaderDep,
    caller: CallerDep,
    format: Annotated[
        ExportFormat | None,
        Query(description="torchscript, pt2 or onnx; default the job's `default_format`."),
    ] = None,
    if_none_match: Annotated[str | None, Header(max_length=200, pattern=PLAIN_PATTERN)] = None,
) -> Response:
    job = visible_job(session, caller, job_id)
    if job.status != JobStatus.succeeded:
        raise HTTPException(409, detail=f"job {job.id} is {job.status}: no model yet")
    if job.purged_at is not None:
        raise ModelPurged(
            f"job {job.id}'s model was removed on {as_utc(job.purged_at)} by the retention "
            "policy (TRAINQ_RETENTION_DAYS or trainq gc); its result and epochs remain"
        )
    # Not asked for a format: the best the job offers (else the first its spec asked for,
    # whose refusal below says why it has none).
    format = format or default_format(job) or asked_formats(job)[0]
    art = get_artifact(session, job_id=job.id, format=format)
    if art is None:
        raise HTTPException(409, detail=not_offered(job, format))
    etag = f'"{art.sha256}"'
    headers = {
        "ETag": etag,
        "Content-Disposition": f'attachment; filename="{filename(job.id, format)}"',
        "Content-Length": str(art.size),
    }
    if if_none_match == etag:
        return Response(status_code=304, headers={"ETag": etag})
    if request.method == "HEAD":
        return Response(headers=headers, media_type=MEDIA_TYPES[format])
    session.close()  # the copy reads from a snapshot of its own
    settings: Settings = request.app.state.settings
    slots: KeySlots = request.app.state.downloads
    slots.take(caller.owner)  # 429 past the downloads a key or this process may hold open
    try:
        model = staged_model(request.app.state.db, settings, job_id=job.id, format=format)
    except BaseException:
        slots.release(caller.owner)
        raise
    if model is None:  # deleted or purged since the look-up above
        slots.release(caller.owner)
        raise HTTPException(404, detail=f"no job {job.id}")
    headers.update({"ETag": f'"{model.sha256}"', "Content-Length": str(model.size)})
    return DownloadResponse(slots, caller.owner, model, headers, MEDIA_TYPES[format], settings)


@router.get(
    "/{job_id}/record",
    responses={**ERRORS, 409: {"model": Problem, "description": "No record yet."}},
    summary="The run record (reproducibility)",
)
def get_record(job_id: JobId, session: ReaderDep, caller: CallerDep) -> dict[str, Any]:
    job = visible_job(session, caller, job_id)
    if job.record is None:
        raise HTTPException(409, detail=f"job {job.id} is {job.status}: no run record yet")
    if caller.admin:
        return job.record
    # The host names one of our machines: a thing for admins, not for every key.
    return {k: v for k, v in job.record.items() if k != "host"}

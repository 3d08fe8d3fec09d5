"""/jobs: submit, list, inspect, follow, cancel, delete, download. The work is in
api.services.jobs and api.services.models. See docs/jobs.md."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from api.access import check_job, check_pretrained, visible_job, visible_status
from api.deletion import delete_job
from api.deps import (
    AsyncRedisDep,
    CallerDep,
    DatabaseDep,
    DownloadsDep,
    EventsDep,
    ReaderDep,
    RedisDep,
    SessionDep,
    SettingsDep,
    SubmitterDep,
)
from api.event_follower import follow_events
from api.events import EventStreamResponse
from api.formats import MEDIA_TYPES
from api.job_queries import JobQueryDep
from api.reads import read
from api.responses import (
    EVENT_STREAM,
    KEY_REUSED,
    NO_JOB,
    NO_KEY,
    OVER_QUOTA,
    TOO_MANY_STREAMS,
    UNAVAILABLE,
    problem,
)
from api.schemas import (
    ConfusionOut,
    EpochOut,
    JobOut,
    JobPage,
    JobRequest,
    MetricPage,
    QuotaProblem,
)
from api.services import jobs
from api.services.jobs import job_out
from api.services.models import send_model, stored_model
from core.labels import LabelsPatch
from core.spec import ExportFormat, JobStatus, user_dataset_id
from core.store import epoch_metrics
from core.stream import MAX_STEP
from core.text import PLAIN_PATTERN

router = APIRouter(prefix="/jobs", tags=["jobs"])
ERRORS = {**NO_KEY, **NO_JOB}
JobId = Annotated[uuid.UUID, "a job id"]
IdempotencyKey = Annotated[str | None, Header(max_length=200, pattern=PLAIN_PATTERN)]


@router.post(
    "",
    status_code=201,
    response_model=JobOut,
    responses={
        **ERRORS,
        200: {"model": JobOut, "description": "Same Idempotency-Key and body: the same job."},
        **KEY_REUSED,
        422: {"description": "Invalid spec or labels; `detail[].loc` names the field."},
        **OVER_QUOTA,
        **UNAVAILABLE,
    },
    summary="Submit a training job",
    description="The body is a JobSpec, with the job's `name`, `tags` and `notes` beside its "
    "fields: they are no part of the spec, so the same spec with other labels and the same "
    "Idempotency-Key answers the job made first, its labels unchanged (200).",
)
async def submit_job(
    body: JobRequest,
    response: Response,
    caller: CallerDep,
    db: DatabaseDep,
    r: RedisDep,
    submitter: SubmitterDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    spec = body.spec()
    if user_dataset_id(spec.dataset) is not None or spec.init_from is not None:
        await read(db, check_job, caller, spec)
    if spec.pretrained:
        await run_in_threadpool(check_pretrained, spec, ("body",))
    job, created = await jobs.submit(submitter, spec, body.labels(), caller, idempotency_key)
    if not created:
        return await jobs.answer_again_async(job, spec, caller, r)
    response.headers["Location"] = f"/jobs/{job.id}"
    return job_out(job, caller)


@router.get(
    "",
    response_model=JobPage,
    responses={**ERRORS, 422: {"description": "A bad filter, sort or cursor, named in `loc`."}},
    summary="Find jobs: filtered, ordered, a page at a time",
    description="Your jobs (an admin key: everyone's), newest first unless `sort` says "
    "otherwise. Every filter given must hold (every `tag`; any `status`). Pass `next` back "
    "as `cursor`, with the same filters and sort, for the following page.",
)
def get_jobs(
    session: ReaderDep,
    caller: CallerDep,
    query: JobQueryDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> JobPage:
    return jobs.find(session, caller, query, limit)


@router.get("/{job_id}", response_model=JobOut, responses=ERRORS, summary="One job")
def get_one(job_id: JobId, session: ReaderDep, r: RedisDep, caller: CallerDep) -> JobOut:
    return job_out(visible_job(session, caller, job_id), caller, r)


@router.patch(
    "/{job_id}",
    response_model=JobOut,
    responses={**ERRORS, 422: {"description": "A bad name, tag or note, named in `loc`."}},
    summary="Rename, tag or annotate a job",
    description="A field left out stays as it is; `name` or `notes` null removes it; `tags` "
    "replaces them all; `add_tags` and `remove_tags` change only those named (so two "
    "changes at once both hold). Past 16 tags: 422. The spec never changes.",
)
def patch_job(
    job_id: JobId, patch: LabelsPatch, session: SessionDep, r: RedisDep, caller: CallerDep
) -> JobOut:
    return job_out(jobs.relabel(session, visible_job(session, caller, job_id), patch), caller, r)


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
    db: DatabaseDep,
    ar: AsyncRedisDep,
    caller: CallerDep,
    after: Annotated[int, Query(ge=0, le=MAX_STEP)] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> Response:
    # The most polled route: plain rows instead of ORM objects, and the page serialised once.
    page = await jobs.metrics_page(db, ar, caller, str(job_id), after, limit)
    return Response(page, media_type="application/json")


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
    "/{job_id}/confusion",
    response_model=ConfusionOut,
    responses=ERRORS,
    summary="An epoch's confusion matrix and per-class accuracy, with the class names",
    description="On the test split, counted during the epoch's evaluation; top-5 accuracy "
    "where there are more than ten classes. Without `epoch`, the last epoch stored; 404 "
    "when there is no such epoch yet.",
)
def get_confusion(
    job_id: JobId,
    session: ReaderDep,
    caller: CallerDep,
    epoch: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
) -> ConfusionOut:
    return jobs.class_figures(session, visible_job(session, caller, job_id), epoch)


@router.get(
    "/{job_id}/events",
    response_class=EventStreamResponse,
    status_code=200,  # the class takes no status_code, so OpenAPI cannot read it from there
    responses={**ERRORS, **EVENT_STREAM, **TOO_MANY_STREAMS},
    summary="Server-Sent Events: steps, epoch ends, status changes",
    description="Resumable with `Last-Event-ID`; the stream ends when the job ends. A "
    "follower that reads slower than the job trains gets a `lagging` event, keyed with the "
    "last entry it was sent, and the stream closes: reconnect with that Last-Event-ID.",
)
async def get_events(
    job_id: JobId,
    db: DatabaseDep,
    ar: AsyncRedisDep,
    hub: EventsDep,
    caller: CallerDep,
    last_event_id: Annotated[str | None, Header(max_length=64, pattern=PLAIN_PATTERN)] = None,
) -> EventStreamResponse:
    await read(db, visible_status, caller, str(job_id))
    return follow_events(hub, db, ar, caller.owner, str(job_id), last_event_id)


@router.post(
    "/{job_id}/cancel",
    response_model=JobOut,
    status_code=202,
    responses={**ERRORS, 409: problem("The job already ended.")},
    summary="Cancel a job",
    description="Queued: it never runs. Running: it stops within a few batches. Both end "
    "`canceled`.",
)
def cancel(
    job_id: JobId,
    session: SessionDep,
    db: DatabaseDep,
    r: RedisDep,
    settings: SettingsDep,
    caller: CallerDep,
) -> JobOut:
    job = visible_job(session, caller, job_id)
    outcome = jobs.cancel(session, r, job)
    out = job_out(job, caller)
    if job.sweep_id and outcome is JobStatus.canceled:
        session.close()  # on SQLite it holds the one write lock the next trial needs
        jobs.next_trial(db, r, settings, job.sweep_id)
    return out


@router.delete(
    "/{job_id}",
    status_code=204,
    responses={
        **ERRORS,
        409: problem(
            "Queued or running: cancel it first; or its model is a registered model's "
            "version: delete the version first."
        ),
    },
    summary="Delete an ended job",
    description="Its model, checkpoint, step and epoch metrics, live stream and record all "
    "go; the job answers 404 from then on. A queued or running job is refused with 409: "
    "cancel it first.",
)
def delete_one(
    job_id: JobId,
    session: ReaderDep,
    db: DatabaseDep,
    r: RedisDep,
    settings: SettingsDep,
    caller: CallerDep,
) -> Response:
    job = visible_job(session, caller, job_id)
    session.close()  # the deletion's own transaction follows; this read holds nothing
    delete_job(db, r, queue=settings.queue, job=job)
    return Response(status_code=204)


MODEL_RESPONSES = {
    **ERRORS,
    200: {
        "content": {t: {} for t in dict.fromkeys(MEDIA_TYPES.values())},
        "description": "The model file: TorchScript (.pt), torch.export (.pt2) or ONNX "
        "(.onnx); without ?format=, the job's `default_format`. Its ETag is its sha256.",
    },
    304: {"description": "If-None-Match holds the ETag: the file has not changed."},
    409: problem(
        "The job has not succeeded (yet), or offers no model in this format: the detail "
        "says why (not asked for in its spec, or failed its check)."
    ),
    410: problem("The retention policy removed the job's model (`purged_at`)."),
    422: {"description": "Unknown format."},
    429: {
        "model": QuotaProblem,
        "description": "Too many downloads open at once, for this key or this API process "
        "(download_max_per_key, download_max_per_process), with Retry-After.",
    },
}


@router.api_route(
    "/{job_id}/model",
    methods=["GET", "HEAD"],
    responses=MODEL_RESPONSES,
    summary="Download the model (TorchScript, pt2 or ONNX)",
    description="Each format is its own file with its own sha256 ETag; the job's "
    "`links.models` lists those it offers. Every format takes float32 images (N, C, H, W) "
    "in [0, 1] and returns logits (N, classes); any batch size.",
)
def get_model(
    job_id: JobId,
    request: Request,
    session: ReaderDep,
    db: DatabaseDep,
    settings: SettingsDep,
    slots: DownloadsDep,
    caller: CallerDep,
    format: Annotated[
        ExportFormat | None,
        Query(description="torchscript, pt2 or onnx; default the job's `default_format`."),
    ] = None,
    if_none_match: Annotated[str | None, Header(max_length=200, pattern=PLAIN_PATTERN)] = None,
) -> Response:
    model = stored_model(session, visible_job(session, caller, job_id), format)
    if if_none_match == model.etag:
        return Response(status_code=304, headers={"ETag": model.etag})
    if request.method == "HEAD":
        return Response(headers=model.headers, media_type=model.media_type)
    session.close()  # the copy reads from a snapshot of its own
    return send_model(db, settings, slots, caller.owner, model)


@router.get(
    "/{job_id}/record",
    responses={**ERRORS, 409: problem("No record yet.")},
    summary="The run record (reproducibility)",
)
def get_record(job_id: JobId, session: ReaderDep, caller: CallerDep) -> dict[str, Any]:
    return jobs.record_for(visible_job(session, caller, job_id), caller)

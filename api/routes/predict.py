"""POST /jobs/{id}/predict: classify images with a job's model, in the format that answers
fastest on the CPU among those the job offers (api.formats.PREDICT_ORDER: ONNX, then
TorchScript, then pt2).

Two ways in (api.json_images, api.image_files), one way out (api.inference):

- `application/json`: `{"images": [...]}`, each image an H×W (grayscale) or C×H×W array of
  numbers in [0, 1], the shape the model was trained on (from the job's run record);
- `multipart/form-data`: PNG or JPEG files in the field `files`, converted to the model's
  channels, resized to its H×W and scaled to [0, 1].

MNIST is white digits on black; `invert=true` (query or form field) takes dark-on-light
images.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy.orm import Session

from api.access import visible_job
from api.auth import Caller
from api.body import BODY_SLACK
from api.deps import CallerDep, read
from api.formats import PREDICT_ORDER
from api.image_files import MAX_FILES, MAX_MULTIPART_BYTES, read_file_images
from api.images import MAX_SIDE
from api.inference import PredictOut, classify
from api.json_images import (
    JSON_BYTES_PER_VALUE,
    MAX_IMAGES,
    MAX_JSON_VALUES,
    PredictRequest,
    read_json_images,
)
from api.routes.jobs import ERRORS, JobId
from api.schemas import Problem
from core.spec import ExportFormat, JobStatus
from core.store import artifact_sha256s

router = APIRouter(prefix="/jobs", tags=["predict"])

# What this route must be allowed to receive (the app-wide body limit must let it through);
# the route enforces its own, tighter, limits while it reads the body, chunked or not.
MAX_BODY_BYTES = max(MAX_MULTIPART_BYTES, MAX_JSON_VALUES * JSON_BYTES_PER_VALUE + BODY_SLACK)

_JSON_SCHEMA = PredictRequest.model_json_schema()
assert "$defs" not in _JSON_SCHEMA  # inlined into the OpenAPI operation below
_MULTIPART_SCHEMA = {
    "type": "object",
    "required": ["files"],
    "properties": {
        "files": {
            "type": "array",
            "items": {"type": "string", "format": "binary"},
            "maxItems": MAX_FILES,
            "description": f"1 to {MAX_FILES} PNG or JPEG files of at most 1 MiB and "
            f"{MAX_SIDE}×{MAX_SIDE} pixels each; converted to the model's channels and "
            "resized to its H×W (reduced as they are decoded).",
        },
        "invert": {
            "type": "boolean",
            "default": False,
            "description": "Dark-on-light images (same as the query parameter).",
        },
    },
}


@dataclass(frozen=True)
class _Target:
    job_id: str
    shape: tuple[int, int, int]  # C, H, W
    format: ExportFormat
    sha256: str


@router.post(
    "/{job_id}/predict",
    response_model=PredictOut,
    max_body_size=MAX_BODY_BYTES,  # above the app's 1 MiB: up to 32 files, 256 RGB 64×64 arrays
    responses={
        **ERRORS,
        409: {"model": Problem, "description": "The job has not succeeded (yet)."},
        413: {"model": Problem, "description": "Body or a file over its size limit."},
        415: {"model": Problem, "description": "Neither JSON nor multipart/form-data."},
        422: {"description": "Invalid images; `detail[].loc` names the image or file."},
        500: {"model": Problem, "description": "The stored model failed its sha256 check."},
        503: {
            "model": Problem,
            "description": "This API process is decoding all the images its budget allows "
            "(max_decode_bytes) and none gave back enough within 5 s; see Retry-After.",
        },
    },
    summary="Classify images with the job's model",
    description='Send JSON `{"images": [...]}` (H×W or C×H×W arrays in [0, 1], at most '
    f"{MAX_IMAGES}, fewer past 3×64×64) or multipart PNG/JPEG `files` (at most {MAX_FILES}, "
    "1 MiB each). "
    "White on black, as MNIST; `invert=true` for dark-on-light images. Returns each "
    "image's class and probabilities, and the format and sha256 of the model that "
    "answered: ONNX (on onnxruntime) when the job offers it, else TorchScript, else pt2.",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _JSON_SCHEMA},
                "multipart/form-data": {"schema": _MULTIPART_SCHEMA},
            },
        }
    },
)
async def predict(
    job_id: JobId,
    request: Request,
    caller: CallerDep,
    invert: Annotated[
        bool, Query(description="Dark-on-light images: use 1 - x (the form field works too).")
    ] = False,
) -> PredictOut:
    # The job first: an unknown job or one without a model is answered before any of the
    # body (up to MAX_BODY_BYTES) is read, and the read's session is closed by then: no
    # database connection is held while a client uploads its images.
    target = await read(request.app.state.db, _target, caller, job_id)
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type == "application/json":
        images = await read_json_images(request, target.shape, invert)
    elif media_type == "multipart/form-data":
        images = await read_file_images(request, target.shape, invert)
    else:
        raise HTTPException(
            415,
            detail=f'send application/json ({{"images": [...]}}) or multipart/form-data '
            f"(PNG or JPEG files in field 'files'), not {media_type or 'no Content-Type'}",
        )
    return await classify(request, target.job_id, target.format, target.sha256, images)


def _target(session: Session, caller: Caller, job_id: uuid.UUID) -> _Target:
    job = visible_job(session, caller, job_id)
    if job.status != JobStatus.succeeded:
        raise HTTPException(409, detail=f"job {job.id} is {job.status}: no model yet")
    stored = artifact_sha256s(session, job_id=job.id)
    fmt = next((f for f in PREDICT_ORDER if f in stored), None)
    if fmt is None:
        raise HTTPException(409, detail=f"job {job.id} has no stored model")
    shape = _input_shape(job.id, job.record)
    return _Target(job_id=job.id, shape=shape, format=fmt, sha256=stored[fmt])


def _input_shape(job_id: str, record: dict[str, Any] | None) -> tuple[int, int, int]:
    shape = ((record or {}).get("dataset") or {}).get("image_shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 3
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
    ):
        raise HTTPException(
            500, detail=f"job {job_id}: its run record has no dataset.image_shape [C, H, W]"
        )
    c, h, w = shape
    return c, h, w

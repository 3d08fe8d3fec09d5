"""What POST /jobs/{id}/predict does: the model it runs (the job's fastest stored format,
api.formats.PREDICT_ORDER) and the input shape that model takes, then the images read
from JSON (api.json_images) or files (api.image_files). See docs/api.md."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session
from starlette.requests import Request

from api.access import visible_job
from api.auth import Caller
from api.formats import PREDICT_ORDER
from api.image_files import read_file_images
from api.json_images import read_json_images
from core.db import Job
from core.errors import ModelDamaged, NoModel, UnsupportedMediaType
from core.spec import ExportFormat, JobStatus
from core.store import artifact_sha256s

if TYPE_CHECKING:
    import torch

    from api.parsers import KeyDecoder


@dataclass(frozen=True)
class Target:
    """The stored model a prediction runs, and the input it takes."""

    job_id: str
    shape: tuple[int, int, int]  # C, H, W
    format: ExportFormat
    sha256: str
    classes: tuple[str, ...]  # the record's class names; () for a job stored before them
    fit: str | None  # how its data set's images were sized (a photo set's); None: stretched


def target(session: Session, caller: Caller, job_id: uuid.UUID) -> Target:
    """The job's model to predict with; NoModel if it has none (yet)."""
    return job_target(session, visible_job(session, caller, job_id))


def job_target(session: Session, job: Job) -> Target:
    """`target` for a job already looked up (by its access check, or a registered
    version's: api.services.registry)."""
    if job.status != JobStatus.succeeded:
        raise NoModel(f"job {job.id} is {job.status}: no model yet")
    stored = artifact_sha256s(session, job_id=job.id)
    fmt = next((f for f in PREDICT_ORDER if f in stored), None)
    if fmt is None:
        raise NoModel(f"job {job.id} has no stored model")
    shape = _input_shape(job.id, job.record)
    return Target(
        job_id=job.id,
        shape=shape,
        format=fmt,
        sha256=stored[fmt],
        classes=_class_names(job.record),
        fit=_fit(job.record),
    )


def _fit(record: dict[str, Any] | None) -> str | None:
    """How the model's data set made its images (the run record's preprocessing, as its model
    card says), which predict's image files are made by too; None for a record without it."""
    fit = ((record or {}).get("preprocessing") or {}).get("fit")
    return fit if isinstance(fit, str) else None


def _class_names(record: dict[str, Any] | None) -> tuple[str, ...]:
    names = ((record or {}).get("dataset") or {}).get("classes")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return ()
    return tuple(names)


def _input_shape(job_id: str, record: dict[str, Any] | None) -> tuple[int, int, int]:
    shape = ((record or {}).get("dataset") or {}).get("image_shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 3
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
    ):
        raise ModelDamaged(f"job {job_id}: its run record has no dataset.image_shape [C, H, W]")
    c, h, w = shape
    return c, h, w


async def read_images(
    request: Request,
    shape: tuple[int, int, int],
    invert: bool,
    decoder: KeyDecoder,
    fit: str | None = None,
) -> torch.Tensor:
    """The body's images as an (N, C, H, W) tensor, by its media type; image files are made
    by the data set's `fit`."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type == "application/json":
        return await read_json_images(request, shape, invert)
    if media_type == "multipart/form-data":
        return await read_file_images(request, shape, invert, decoder, fit)
    raise UnsupportedMediaType(
        f'send application/json ({{"images": [...]}}) or multipart/form-data '
        f"(PNG or JPEG files in field 'files'), not {media_type or 'no Content-Type'}"
    )

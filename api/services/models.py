"""What GET /jobs/{id}/model does: which stored model a request names, its headers, and
its bytes sent from a copy within the download limits (api.downloads). See docs/jobs.md."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Response
from sqlalchemy.orm import Session

from api.downloads import DownloadResponse, staged_model
from api.formats import MEDIA_TYPES, asked_formats, default_format, filename, not_offered
from api.slots import KeySlots
from core.config import Settings
from core.db import Database, Job, as_utc
from core.errors import ModelPurged, NoModel, NotFound
from core.spec import ExportFormat, JobStatus
from core.store import get_artifact


@dataclass(frozen=True)
class StoredModel:
    """One model file a job offers, as its headers describe it."""

    job_id: str
    format: ExportFormat
    headers: dict[str, str]

    @property
    def etag(self) -> str:
        return self.headers["ETag"]

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]


def stored_model(session: Session, job: Job, format: ExportFormat | None) -> StoredModel:
    """The job's model in `format` (none: the best it offers, else the first its spec asked
    for, whose refusal says why it has none); NoModel or ModelPurged when there is none."""
    if job.status != JobStatus.succeeded:
        raise NoModel(f"job {job.id} is {job.status}: no model yet")
    if job.purged_at is not None:
        raise ModelPurged(
            f"job {job.id}'s model was removed on {as_utc(job.purged_at)} by the retention "
            "policy (TRAINQ_RETENTION_DAYS or trainq gc); its result and epochs remain"
        )
    format = format or default_format(job) or asked_formats(job)[0]
    art = get_artifact(session, job_id=job.id, format=format)
    if art is None:
        raise NoModel(not_offered(job, format))
    headers = {
        "ETag": f'"{art.sha256}"',
        "Content-Disposition": f'attachment; filename="{filename(job.id, format)}"',
        "Content-Length": str(art.size),
    }
    return StoredModel(job.id, format, headers)


def send_model(
    db: Database, settings: Settings, slots: KeySlots, owner: str, model: StoredModel
) -> Response:
    """The model's bytes, from a copy made now, holding one of `owner`'s download slots
    until it is sent (ProcessBusy past the slots a key or this process may hold)."""
    slots.take(owner)
    try:
        copy = staged_model(db, settings, job_id=model.job_id, format=model.format)
    except BaseException:
        slots.release(owner)
        raise
    if copy is None:  # deleted or purged since the look-up
        slots.release(owner)
        raise NotFound(f"no job {model.job_id}")
    headers = {**model.headers, "ETag": f'"{copy.sha256}"', "Content-Length": str(copy.size)}
    return DownloadResponse(slots, owner, copy, headers, model.media_type, settings)

"""Model downloads in flight: each sent from its copy (api.model_blob), within the download
slots (api.slots), and cut off when its client stops reading. See docs/jobs.md."""

from __future__ import annotations

import asyncio
import logging

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.model_blob import ModelCopy, copy_model
from api.slots import KeySlots, SlotLimit
from core.config import Settings
from core.db import Database
from core.errors import Unavailable

log = logging.getLogger("trainq.api")


def download_slots(settings: Settings) -> KeySlots:
    """The downloads open in this process, per owner and in all."""
    return KeySlots(
        "model downloads open",
        per_key=SlotLimit("download_max_per_key", settings.download_max_per_key),
        per_process=SlotLimit("download_max_per_process", settings.download_max_per_process),
    )


def staged_model(db: Database, settings: Settings, *, job_id: str, format: str) -> ModelCopy | None:
    """The model copied out of the database to be sent (api.model_blob), into
    data_dir/downloads, or None if the job has none in `format`. A data directory that
    cannot take the copy (full, read-only) answers 503 with Retry-After."""
    try:
        return copy_model(db, job_id=job_id, format=format, folder=settings.data_dir / "downloads")
    except OSError as e:
        log.warning("could not copy a model of job %s to send it: %s", job_id, e)
        raise Unavailable(
            "the API has no room to stage this download (its data directory is full "
            "or not writable); retry shortly"
        ) from e


class DownloadResponse(Response):
    """A model's bytes, sent from its copy (api.model_blob). Each chunk must be
    taken by the client within download_send_timeout_s, or the response is cut: a client
    that stops reading holds its slot and its copy no longer. The slot is released and the
    copy closed however the response ends (sent, cut, the client gone, the server
    stopping)."""

    def __init__(
        self,
        slots: KeySlots,
        owner: str,
        model: ModelCopy,
        headers: dict[str, str],
        media: str,
        settings: Settings,
    ) -> None:
        super().__init__(headers=headers, media_type=media)
        self.slots, self.owner, self.model = slots, owner, model
        self.send_timeout_s = settings.download_send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            chunks = self.model.chunks()
            while chunk := await run_in_threadpool(next, chunks, b""):
                body = {"type": "http.response.body", "body": chunk, "more_body": True}
                await asyncio.wait_for(send(body), self.send_timeout_s)
            end = {"type": "http.response.body", "body": b"", "more_body": False}
            await asyncio.wait_for(send(end), self.send_timeout_s)
        except TimeoutError:
            log.warning(
                "a download of %s bytes was cut: its client took less than a chunk in %g s",
                self.model.size,
                self.send_timeout_s,
            )
        except OSError:
            pass  # the client went away
        finally:
            await run_in_threadpool(self.model.close)
            self.slots.release(self.owner)

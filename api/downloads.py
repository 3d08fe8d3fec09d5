"""Model downloads in flight: each holds a database connection (its snapshot) for as long
as its client takes to read it, so their number is bounded per key and per API process,
below the connection pool: a key that opens downloads and never reads them cannot take the
connections every other request needs."""

from __future__ import annotations

import threading
from collections import Counter

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.errors import RETRY_AFTER_S
from core.config import Settings
from core.errors import QuotaExceeded
from core.store.model_blob import ModelBlob


class DownloadSlots:
    """The downloads open in this process, per owner and in all (routes run in threads)."""

    def __init__(self, settings: Settings) -> None:
        self.max_per_key = settings.download_max_per_key
        self.max_per_process = settings.download_max_per_process
        self.open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, owner: str) -> None:
        """Count one more download of `owner`'s, or raise QuotaExceeded (429)."""
        with self._lock:
            if self.open.total() >= self.max_per_process:
                raise _refusal("download_max_per_process", self.max_per_process, owner)
            if self.open[owner] >= self.max_per_key:
                raise _refusal("download_max_per_key", self.max_per_key, owner)
            self.open[owner] += 1

    def release(self, owner: str) -> None:
        with self._lock:
            self.open[owner] -= 1
            if self.open[owner] <= 0:
                del self.open[owner]


def _refusal(limit: str, allowed: int, owner: str) -> QuotaExceeded:
    return QuotaExceeded(
        f"{allowed} model downloads are open already, the most {limit} allows: retry when "
        "one has ended",
        limit=limit,
        value=allowed,
        usage=allowed,
        owner=owner,
        retry_after_s=int(RETRY_AFTER_S),
    )


class DownloadResponse(StreamingResponse):
    """A model's bytes; its slot is released and its snapshot closed however the response
    ends (sent, the client gone, the server stopping)."""

    def __init__(
        self, slots: DownloadSlots, owner: str, blob: ModelBlob, headers: dict[str, str], media: str
    ) -> None:
        super().__init__(blob.chunks(), headers=headers, media_type=media)
        self.slots, self.owner, self.blob = slots, owner, blob

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slots.release(self.owner)

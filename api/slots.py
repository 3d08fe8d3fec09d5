"""The one limiter of what an API process holds at once (downloads open, uploads being
checked, event streams), per key and in all; past either, ProcessBusy (429).
See docs/quotas.md."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from api.errors import RETRY_AFTER_S
from core.errors import ProcessBusy


@dataclass(frozen=True)
class SlotLimit:
    setting: str  # the Settings field that sets it, named in the refusal
    allowed: int


class KeySlots:
    """The `what` (e.g. "model downloads open") held in this process, per owner and in all."""

    def __init__(self, what: str, *, per_key: SlotLimit, per_process: SlotLimit) -> None:
        self.what, self.per_key, self.per_process = what, per_key, per_process
        self.open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, owner: str) -> None:
        """Count one more of `owner`'s, or raise ProcessBusy (429 with Retry-After)."""
        with self._lock:
            if self.open.total() >= self.per_process.allowed:
                held = f"{self.per_process.allowed} {self.what} in this API process"
                raise self._refusal(self.per_process, owner, held)
            if self.open[owner] >= self.per_key.allowed:
                held = f"this key has {self.per_key.allowed} {self.what}"
                raise self._refusal(self.per_key, owner, held)
            self.open[owner] += 1

    def release(self, owner: str) -> None:
        with self._lock:
            self.open[owner] -= 1
            if self.open[owner] <= 0:
                del self.open[owner]

    @contextmanager
    def held(self, owner: str) -> Iterator[None]:
        self.take(owner)
        try:
            yield
        finally:
            self.release(owner)

    def _refusal(self, limit: SlotLimit, owner: str, held: str) -> ProcessBusy:
        others = " (other keys' go on)" if limit is self.per_key else ""
        return ProcessBusy(
            f"{held} already, the most {limit.setting} allows{others}: retry shortly, when one "
            "has ended",
            limit=limit.setting,
            value=limit.allowed,
            owner=owner,
            retry_after_s=int(RETRY_AFTER_S),
        )

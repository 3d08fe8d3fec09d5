"""HealthCache: the last health probe of one API process, so that a burst of GET /health
costs one probe. See docs/operations.md."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from api.schemas import Health


class HealthCache:
    """The last probe of one API process, at most `fresh_s` old."""

    def __init__(self, fresh_s: float = 1.0) -> None:
        self.fresh_s = fresh_s
        self._lock = threading.Lock()
        self._last: tuple[float, Health] | None = None

    def get(self, probe: Callable[[], Health]) -> Health:
        with self._lock:  # concurrent callers wait for one probe instead of each making one
            if self._last is None or time.monotonic() - self._last[0] > self.fresh_s:
                self._last = (time.monotonic(), probe())
            return self._last[1]

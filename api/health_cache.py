"""HealthCache: the last health probe of one API process, so that a burst of GET /health
costs one probe, and the parts of a probe still running, so that a stalled server holds one
thread of a probe, not one a probe. See docs/operations.md."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from api.schemas import Health

T = TypeVar("T")


class HealthCache:
    """The last probe of one API process, at most `fresh_s` old."""

    def __init__(self, fresh_s: float = 1.0) -> None:
        self.fresh_s = fresh_s
        self._lock = threading.Lock()
        self._last: tuple[float, Health] | None = None
        self._parts_lock = threading.Lock()
        self._parts: dict[str, Future[Any]] = {}

    def get(self, probe: Callable[[], Health]) -> Health:
        with self._lock:  # concurrent callers wait for one probe instead of each making one
            if self._last is None or time.monotonic() - self._last[0] > self.fresh_s:
                self._last = (time.monotonic(), probe())
            return self._last[1]

    def part(self, name: str, fn: Callable[[], T]) -> Future[T]:
        """`fn` run in a thread of its own, which a probe waits for only so long; or, while
        the run an earlier probe started under `name` has not ended (its server stalls), that
        run, not another beside it."""
        with self._parts_lock:
            running = self._parts.get(name)
            if running is not None and not running.done():
                return running
            future: Future[T] = Future()
            self._parts[name] = future
        # A daemon: a run stuck on a stalled server never holds up the process's exit.
        threading.Thread(target=_run, args=(future, fn), name=f"health-{name}", daemon=True).start()
        return future


def _run(future: Future[T], fn: Callable[[], T]) -> None:
    try:
        future.set_result(fn())
    except BaseException as e:
        future.set_exception(e)

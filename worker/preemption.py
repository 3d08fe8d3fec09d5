"""The work horse's SIGTERM: a stopping worker hands its running job back. See
docs/jobs.md."""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any


class Preemption:
    """The work horse's SIGTERM (worker.rq_worker sends it on a warm shutdown): the running
    attempt stops at its next step and hands the job back. The handler holds for the job
    function's run; the one it replaced comes back after."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():  # signals need the main one
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            # worker.rq_worker holds SIGTERM in a new horse until now: one sent before this handler
            # was in place is delivered to it here, and the job is handed back
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        self.requested = True

    def asked(self) -> bool:
        return self.requested

"""The heartbeat of a running attempt: a thread in the work horse that writes the job row's
`heartbeat_at` every few seconds while the trainer makes progress, and a stop request
(SIGTERM) as soon as it arrives. See docs/jobs.md."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable

from core.db import Database
from core.errors import JobSuperseded
from core.store import heartbeat, record_stop_request

log = logging.getLogger("trainq.worker")
STOP_POLL_S = 0.2  # how soon a stop request reaches the database (SIGKILL follows in ~10 s)


class Heartbeat:
    """Beats for one attempt between `start` and `stop`. The main thread reads
    `cancel_requested` (the database's word, for when Redis is away) and `superseded` (the
    attempt no longer owns the job: stop it). `stop_asked` says whether the worker was asked
    to stop: a flag that a signal handler sets, read here."""

    def __init__(
        self,
        db: Database,
        *,
        job_id: str,
        attempt: int,
        every_s: float,
        stall_timeout_s: float,
        stop_asked: Callable[[], bool] = lambda: False,
    ) -> None:
        self.db = db
        self.job_id = job_id
        self.attempt = attempt
        self.every_s = every_s
        self.stall_timeout_s = stall_timeout_s
        self.stop_asked = stop_asked
        self.stop_recorded = False
        self.cancel_requested = False
        self.superseded = False
        self.progress_at = time.monotonic()
        self._stopping = threading.Event()
        # A copy of the caller's context: log lines from the thread carry the job id too.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._beat_until_stopped,), name="heartbeat", daemon=True
        )

    def touch(self) -> None:
        """The trainer made progress (a plain store: cheap enough for every step block)."""
        self.progress_at = time.monotonic()

    def start(self) -> None:
        self.touch()
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _beat_until_stopped(self) -> None:
        stalled = False
        due = time.monotonic() + self.every_s
        while not self._stopping.wait(min(self.every_s, STOP_POLL_S)):
            if self.stop_asked() and not self.stop_recorded:
                self._record_stop_request()
            if time.monotonic() < due:
                continue
            due = time.monotonic() + self.every_s
            idle = time.monotonic() - self.progress_at
            if idle > self.stall_timeout_s:
                if not stalled:
                    log.error(
                        "job %s: attempt %d made no progress for %.0f s; it stops beating, so "
                        "it will be declared lost",
                        self.job_id, self.attempt, idle,
                    )  # fmt: skip
                stalled = True
                continue
            stalled = False
            if not self.beat():
                return

    def beat(self) -> bool:
        """One heartbeat; False once the attempt no longer owns the job. A beat that fails
        (SQLite locked past its busy timeout, the database briefly away) is skipped: the
        next one tries again, well within the heartbeat timeout."""
        try:
            with self.db.writer() as s:
                if heartbeat(s, job_id=self.job_id, attempt=self.attempt):
                    self.cancel_requested = True
        except JobSuperseded:
            self.superseded = True
            return False
        except Exception as e:  # the thread must outlive any one failed write
            log.warning("job %s: heartbeat skipped (%s); trying again", self.job_id, e)
        return True

    def _record_stop_request(self) -> None:
        """Written once; a write that fails is tried again at the next poll."""
        try:
            with self.db.writer() as s:
                record_stop_request(s, job_id=self.job_id, attempt=self.attempt)
        except Exception as e:  # the thread must outlive any one failed write
            log.warning("job %s: stop request not recorded yet (%s)", self.job_id, e)
            return
        self.stop_recorded = True
        log.info("job %s: attempt %d was asked to stop", self.job_id, self.attempt)

"""Telling Redis of a committed cancel: a running attempt is asked to stop at once (it also
reads the flag from the database with its heartbeat), and a queued job's followers see its
end. See docs/jobs.md."""

from __future__ import annotations

from redis import Redis

from core.db import Job
from core.spec import JobStatus
from core.stream import ask_to_stop, publish_status


def announce_cancel(r: Redis, job: Job, outcome: JobStatus) -> None:
    if outcome is JobStatus.running:
        ask_to_stop(r, job.id)
        return
    error = {"code": job.error_code, "message": job.error_message}
    payload = {"status": JobStatus.canceled, "error": error}
    publish_status(r, job.id, job.progress_step, payload, attempt=job.attempt)

"""Telling Redis of a committed cancel: a running attempt is asked to stop at once (it also
reads the flag from the database with its heartbeat), and a queued job's followers see its
end. See docs/jobs.md."""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis
from sqlalchemy.orm import Session

from core.db import Job
from core.spec import JobStatus
from core.stream import ask_to_stop, publish_status


@dataclass(frozen=True)
class Canceled:
    """What Redis is told of one canceled job, read in the cancel's own transaction, before
    its commit: once committed, the job may be deleted before it could be read again."""

    job_id: str
    outcome: JobStatus  # its status when canceled: running, or queued
    attempt: int
    step: int
    error: dict[str, str | None]


def canceled(session: Session, job: Job, outcome: JobStatus) -> Canceled:
    """The job as the uncommitted cancel left it."""
    session.refresh(job)
    error = {"code": job.error_code, "message": job.error_message}
    return Canceled(job.id, outcome, job.attempt, job.progress_step, error)


def announce_cancel(r: Redis, c: Canceled) -> None:
    if c.outcome is JobStatus.running:
        ask_to_stop(r, c.job_id)
        return
    payload = {"status": JobStatus.canceled, "error": c.error}
    publish_status(r, c.job_id, c.step, payload, attempt=c.attempt)

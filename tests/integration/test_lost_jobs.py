"""A lost job is declared lost only if it is still silent when the update lands: a
reconciler holding a stale read never requeues or ends an attempt that beat since then."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import update

from core.config import Settings
from core.db import Database, Job, JobStatus, utcnow
from core.migrate import upgrade
from core.reconcile import Report, _handle_lost
from core.spec import JobSpec
from core.store import claim_job, create_job, end_job, get_job, heartbeat, lost_jobs, requeue_job
from tests.service import RedisServer

TIMEOUT = dt.timedelta(seconds=30)
QUEUE = f"trainq-test-{uuid.uuid4().hex[:8]}"  # requeued jobs go here, to no worker


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[Database]:
    upgrade(database_url)
    database = Database(database_url)
    yield database
    database.dispose()


def silent_running_job(db: Database, max_restarts: int = 2) -> Job:
    """A running attempt last heard of a minute ago, as a reconciler reads it."""
    job_id = str(uuid.uuid4())
    with db.session() as s:
        create_job(s, job_id=job_id, spec=JobSpec(max_restarts=max_restarts), owner="o")
    with db.session() as s:
        claim_job(s, job_id=job_id, worker="w", device="cpu")
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(heartbeat_at=utcnow() - dt.timedelta(seconds=60))
        )
    with db.session() as s:
        [job] = [j for j in lost_jobs(s, silent_since=utcnow() - TIMEOUT) if j.id == job_id]
    return job


def beat(db: Database, job: Job) -> None:
    """The attempt beats after the reconciler's read: it is alive after all."""
    with db.session() as s:
        heartbeat(s, job_id=job.id, attempt=job.attempt)


def test_requeue_with_a_stale_view_does_nothing_after_a_fresh_heartbeat(db: Database) -> None:
    stale = silent_running_job(db)
    silent_since = utcnow() - TIMEOUT
    beat(db, stale)
    with db.session() as s:
        assert not requeue_job(
            s, job_id=stale.id, attempt=1, queue_entry=f"{stale.id}-a2", silent_since=silent_since
        )
        assert not end_job(
            s,
            job_id=stale.id,
            status=JobStatus.failed,
            code="worker_lost",
            attempt=1,
            silent_since=silent_since,
        )
        job = get_job(s, job_id=stale.id)
        assert job is not None and job.status == JobStatus.running and job.attempt == 1
    # Still silent: the same calls win.
    with db.session() as s:
        assert requeue_job(
            s,
            job_id=stale.id,
            attempt=1,
            queue_entry=f"{stale.id}-a2",
            silent_since=utcnow() + dt.timedelta(seconds=1),
        )


@pytest.mark.parametrize("max_restarts", [2, 0])  # requeued, or failed worker_lost
def test_the_reconciler_leaves_an_attempt_that_beat_since_its_read_alone(
    db: Database, redis_server: RedisServer, max_restarts: int
) -> None:
    stale = silent_running_job(db, max_restarts)
    beat(db, stale)
    report = Report()
    with redis_server.client() as r:
        _handle_lost(db, r, Settings(heartbeat_timeout_s=30, queue=QUEUE), stale, report)
    assert report.requeued == [] and report.failed == []
    with db.session() as s:
        job = get_job(s, job_id=stale.id)
        assert job is not None
        assert (job.status, job.attempt, job.queue_entry) == (
            JobStatus.running,
            1,
            stale.queue_entry,
        )


@pytest.mark.parametrize("max_restarts", [2, 0])
def test_the_reconciler_still_handles_an_attempt_that_stayed_silent(
    db: Database, redis_server: RedisServer, max_restarts: int
) -> None:
    stale = silent_running_job(db, max_restarts)
    report = Report()
    with redis_server.client() as r:
        _handle_lost(db, r, Settings(heartbeat_timeout_s=30, queue=QUEUE), stale, report)
    with db.session() as s:
        job = get_job(s, job_id=stale.id)
        assert job is not None
    if max_restarts:
        assert report.requeued == [stale.id] and job.status == JobStatus.queued
    else:
        assert report.failed == [stale.id] and job.status == JobStatus.failed
        assert job.error_code == "worker_lost"

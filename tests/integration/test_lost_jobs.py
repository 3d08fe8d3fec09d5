"""A lost job is declared lost only if it is still silent when the update lands: a
reconciler holding a stale read never requeues or ends an attempt that beat since then.
Silence is judged by the database's clock: a host whose clock is off neither loses a
healthy attempt nor hides a dead one, and a long epoch write is not silence. An attempt
whose worker was asked to stop is, once lost, a preemption rather than a restart."""

from __future__ import annotations

import datetime as dt
import sys
import threading
import time
import types
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, text, update

import core.db
from core.config import Settings
from core.db import Database, Job, utcnow
from core.spec import JobSpec, JobStatus
from core.store import (
    claim_job,
    create_job,
    end_job,
    get_job,
    heartbeat,
    latest_checkpoint,
    lost_jobs,
    preempt_job,
    record_stop_request,
    requeue_job,
    save_epoch,
)
from core.train import EpochMetrics
from tests.db import running_job
from tests.service import RedisServer, wait_until
from worker.reconciler import Report, handle_lost, reconcile_once

TIMEOUT = dt.timedelta(seconds=30)
QUEUE = f"trainq-test-{uuid.uuid4().hex[:8]}"  # requeued jobs go here, to no worker


def silent_running_job(db: Database, max_restarts: int = 2) -> Job:
    """A running attempt last heard of a minute ago, as a reconciler reads it."""
    job_id = running_job(db, worker="gpu-host-7-gpu0-4242", max_restarts=max_restarts)
    with db.writer() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(heartbeat_at=utcnow() - dt.timedelta(seconds=60))
        )
    with db.writer() as s:
        [job] = [j for j in lost_jobs(s, silent_since=utcnow() - TIMEOUT) if j.id == job_id]
    return job


def beat(db: Database, job: Job) -> None:
    """The attempt beats after the reconciler's read: it is alive after all."""
    with db.writer() as s:
        heartbeat(s, job_id=job.id, attempt=job.attempt)


def test_requeue_with_a_stale_view_does_nothing_after_a_fresh_heartbeat(db: Database) -> None:
    stale = silent_running_job(db)
    silent_since = utcnow() - TIMEOUT
    beat(db, stale)
    with db.writer() as s:
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
    with db.writer() as s:
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
        handle_lost(db, r, Settings(heartbeat_timeout_s=30, queue=QUEUE), stale, report)
    assert report.requeued == [] and report.failed == []
    with db.writer() as s:
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
        handle_lost(db, r, Settings(heartbeat_timeout_s=30, queue=QUEUE), stale, report)
    with db.writer() as s:
        job = get_job(s, job_id=stale.id)
        assert job is not None
    if max_restarts:
        assert report.requeued == [stale.id] and job.status == JobStatus.queued
    else:
        assert report.failed == [stale.id] and job.status == JobStatus.failed
        assert job.error_code == "worker_lost"
        # The message is the tenant's to read; the worker's name (its host) is not.
        assert job.error_message and "gpu-host-7" not in job.error_message


@contextmanager
def clock_off(seconds: float) -> Iterator[None]:
    """This process's clock, as trainq reads it (core.db.utcnow, under every name a module
    imported it by), `seconds` off: a host whose clock has drifted."""
    real = core.db.utcnow

    def drifted() -> dt.datetime:
        return real() + dt.timedelta(seconds=seconds)

    with pytest.MonkeyPatch.context() as mp:
        for module in list(sys.modules.values()):
            if isinstance(module, types.ModuleType) and vars(module).get("utcnow") is real:
                mp.setattr(module, "utcnow", drifted)
        yield


def beating_job(db: Database, max_restarts: int = 2) -> str:
    """A job claimed, and beaten for, by a worker on this host (its clock as it is now)."""
    job_id = running_job(db, worker="w", max_restarts=max_restarts)
    with db.writer() as s:
        heartbeat(s, job_id=job_id, attempt=1)
    return job_id


def status_of(db: Database, job_id: str) -> tuple[str, int, int]:
    with db.writer() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None
        return job.status, job.attempt, job.preemptions


@pytest.mark.parametrize(("worker_off", "reconciler_off"), [(-120, 0), (0, 120)])
def test_an_attempt_beating_on_a_slow_clock_is_not_lost(
    db: Database, redis_server: RedisServer, worker_off: float, reconciler_off: float
) -> None:
    """A worker host 2 minutes slow, or a reconciler's host 2 minutes fast: the attempt beat
    a moment ago, well inside the 30 s timeout."""
    with clock_off(worker_off):
        job_id = beating_job(db)
    with clock_off(reconciler_off), redis_server.client() as r:
        report = reconcile_once(db, r, Settings(heartbeat_timeout_s=30, queue=QUEUE))
    assert job_id not in report.requeued + report.failed
    assert status_of(db, job_id) == (JobStatus.running, 1, 0)


def wait_reconciled(
    db: Database, redis_server: RedisServer, settings: Settings, job_id: str, outcome: str
) -> None:
    """Reconcile until a pass reports `job_id` among its `outcome` (a Report field)."""
    with redis_server.client() as r:
        wait_until(
            lambda: job_id in getattr(reconcile_once(db, r, settings), outcome),
            20,
            f"the job to be {outcome}",
            0.2,
        )


def test_a_dead_worker_on_a_fast_clock_is_still_lost(
    db: Database, redis_server: RedisServer
) -> None:
    """Its beats were stamped 2 minutes ahead; it died; 1 s of silence is 1 s."""
    with clock_off(120):
        job_id = beating_job(db)
    settings = Settings(heartbeat_timeout_s=1, queue=QUEUE)
    wait_reconciled(db, redis_server, settings, job_id, "requeued")
    assert status_of(db, job_id) == (JobStatus.queued, 1, 0)


def test_a_job_written_on_a_fast_clock_and_never_enqueued_is_enqueued(
    db: Database, redis_server: RedisServer
) -> None:
    """An API host 2 minutes fast inserted the row and died before its enqueue."""
    job_id = str(uuid.uuid4())
    with clock_off(120), db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec(), owner="o")
    settings = Settings(queue_grace_s=1, queue=QUEUE)
    wait_reconciled(db, redis_server, settings, job_id, "reenqueued")


def waiting_on_a_lock(db: Database) -> bool:
    with db.engine.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        ).scalar_one()
    return bool(waiting)


@contextmanager
def slow_checkpoint_writes(db: Database) -> Iterator[tuple[threading.Event, threading.Event]]:
    """A slow disk under `db`: each checkpoint INSERT starts (`writing` is set), then takes
    until `done` is set."""
    writing, done = threading.Event(), threading.Event()

    def slow(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("INSERT INTO checkpoints"):
            writing.set()
            done.wait(60)

    event.listen(db.engine, "before_cursor_execute", slow)
    try:
        yield writing, done
    finally:
        done.set()
        event.remove(db.engine, "before_cursor_execute", slow)


def test_an_epoch_write_longer_than_the_heartbeat_timeout_is_not_lost(
    db: Database, redis_server: RedisServer, database_url: str
) -> None:
    """A big checkpoint on a slow disk: save_epoch writes for longer than the 1 s timeout
    while a reconciler (another host's) runs, and the heartbeat thread could not beat (its
    last beat is a minute old). The attempt keeps the job; the save commits."""
    job = silent_running_job(db)
    epoch = EpochMetrics(1, 16, 0.5, 0.9, 0.4, 0.9, 1.0, 100.0)
    settings = Settings(heartbeat_timeout_s=1, queue=QUEUE)
    other = Database(database_url, busy_timeout_s=60)  # it waits for the write, however long
    reports: list[Report] = []

    def save() -> None:
        with db.writer() as s:
            save_epoch(s, job_id=job.id, attempt=1, epoch=epoch, steps=[], checkpoint=b"weights")

    try:
        with redis_server.client() as r, slow_checkpoint_writes(db) as (writing, done):
            saver = threading.Thread(target=save)
            saver.start()
            assert writing.wait(20)
            time.sleep(1.5)  # still writing, past the heartbeat timeout
            reconciler = threading.Thread(
                target=lambda: reports.append(reconcile_once(other, r, settings))
            )
            reconciler.start()
            if db.local:
                time.sleep(0.5)  # it waits for SQLite's write lock
            else:
                wait_until(lambda: waiting_on_a_lock(other), 20, "the reconciler to wait")
            done.set()
            saver.join(timeout=60)
            reconciler.join(timeout=60)
    finally:
        other.dispose()
    [report] = reports
    assert job.id not in report.requeued + report.failed
    assert status_of(db, job.id) == (JobStatus.running, 1, 0)
    with db.writer() as s:
        checkpoint = latest_checkpoint(s, job_id=job.id)
        assert checkpoint is not None and checkpoint.data == b"weights"


def test_a_lost_attempt_asked_to_stop_is_a_preemption(
    db: Database, redis_server: RedisServer
) -> None:
    """max_restarts 0: a restart would fail it, a preemption requeues it."""
    stale = silent_running_job(db, max_restarts=0)
    with db.writer() as s:
        record_stop_request(s, job_id=stale.id, attempt=1)
    [seen] = [j for j in lost_now(db) if j.id == stale.id]
    report = Report()
    with redis_server.client() as r:
        handle_lost(db, r, Settings(heartbeat_timeout_s=30, queue=QUEUE), seen, report)
    assert report.requeued == [stale.id]
    assert status_of(db, stale.id) == (JobStatus.queued, 1, 1)


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_a_clean_preemption_is_counted_once(
    db: Database, redis_server: RedisServer, max_restarts: int
) -> None:
    """Attempt 1 was asked to stop and handed the job back; attempt 2 is then lost, which is
    a restart: with max_restarts 0 the job fails, with 1 it is requeued, one preemption."""
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec(max_restarts=max_restarts), owner="o")
    with db.writer() as s:
        claim_job(s, job_id=job_id, worker="w", device="cpu")
        record_stop_request(s, job_id=job_id, attempt=1)
    with db.writer() as s:
        assert preempt_job(
            s,
            job_id=job_id,
            attempt=1,
            epoch=0,
            step=3,
            steps=[],
            checkpoint=b"mid-epoch",
            queue_entry=f"{job_id}-p1",
        )
    with db.writer() as s:
        claim_job(s, job_id=job_id, worker="w2", device="cpu")
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(heartbeat_at=utcnow() - dt.timedelta(seconds=60))
        )
    [seen] = [j for j in lost_now(db) if j.id == job_id]
    report = Report()
    with redis_server.client() as r:
        handle_lost(db, r, Settings(heartbeat_timeout_s=30, queue=QUEUE), seen, report)
    if max_restarts:
        assert report.requeued == [job_id]
        assert status_of(db, job_id) == (JobStatus.queued, 2, 1)
    else:
        assert report.failed == [job_id]
        assert status_of(db, job_id) == (JobStatus.failed, 2, 1)


def lost_now(db: Database) -> list[Job]:
    with db.writer() as s:
        return list(lost_jobs(s, silent_since=utcnow() - TIMEOUT))

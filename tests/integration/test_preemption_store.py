"""Preemption in the store, on both databases: a stopping worker's attempt hands its job
back (running -> queued) with its mid-epoch checkpoint and steps in one guarded
transaction, and the reconciler does not count that as a restart."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import update

from core.config import Settings
from core.db import Database, Job, utcnow
from core.spec import JobStatus
from core.store import (
    claim_job,
    end_job,
    get_job,
    latest_checkpoint,
    preempt_job,
    save_epoch,
    step_metrics,
)
from core.train import EpochMetrics, StepMetrics
from tests.db import running_job
from tests.service import RedisServer
from worker.reconciler import reconcile_once


def point(step: int, epoch: int) -> StepMetrics:
    return StepMetrics(step, epoch, 1.0 / step, 1e-3, 100.0, 0, 0, 0, 0.0)


def preempt(db: Database, job_id: str, attempt: int, step: int, steps: list[int]) -> bool:
    with db.writer() as s:
        return preempt_job(
            s,
            job_id=job_id,
            attempt=attempt,
            epoch=2,
            step=step,
            steps=[point(i, 2) for i in steps],
            checkpoint=f"mid-{step}".encode(),
            queue_entry=f"{job_id}-p{attempt}",
        )


def test_a_preempted_attempt_hands_back_its_checkpoint_and_steps(db: Database) -> None:
    job_id = running_job(db)
    with db.writer() as s:
        save_epoch(
            s,
            job_id=job_id,
            attempt=1,
            epoch=EpochMetrics(1, 3, 0.5, 0.9, 0.4, 0.9, 1.0, 100.0),
            steps=[point(i, 1) for i in (1, 2, 3)],
            checkpoint=b"epoch-1",
        )
    assert preempt(db, job_id, attempt=1, step=5, steps=[4, 5])
    with db.writer() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None
        assert (job.status, job.worker, job.attempt, job.preemptions) == ("queued", None, 1, 1)
        assert (job.queue_entry, job.progress_step) == (f"{job_id}-p1", 5)
        checkpoint = latest_checkpoint(s, job_id=job_id)
        assert checkpoint is not None and (checkpoint.step, checkpoint.data) == (5, b"mid-5")
        assert [p.step for p in step_metrics(s, job_id=job_id, after=0, limit=100)] == [
            1,
            2,
            3,
            4,
            5,
        ]
    # The next attempt resumes there; the handed-back attempt can no longer touch the job.
    with db.writer() as s:
        resumed = claim_job(s, job_id=job_id, worker="w2", device="cpu")
        assert resumed is not None and resumed.attempt == 2
    assert not preempt(db, job_id, attempt=1, step=7, steps=[6, 7])
    with db.writer() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None and (job.status, job.worker, job.preemptions) == ("running", "w2", 1)
        checkpoint = latest_checkpoint(s, job_id=job_id)
        assert checkpoint is not None and checkpoint.data == b"mid-5"


def test_an_ended_job_is_never_preempted_back_to_queued(db: Database) -> None:
    job_id = running_job(db)
    with db.writer() as s:
        assert end_job(s, job_id=job_id, status=JobStatus.canceled, code="canceled")
    assert not preempt(db, job_id, attempt=1, step=2, steps=[1, 2])
    with db.writer() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None and job.status == JobStatus.canceled
        assert latest_checkpoint(s, job_id=job_id) is None


def lose(db: Database, job_id: str) -> None:
    """The running attempt's worker dies: its heartbeat goes silent."""
    with db.writer() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(heartbeat_at=utcnow() - dt.timedelta(minutes=10))
        )


def test_a_preemption_is_not_counted_as_a_restart(
    db: Database, database_url: str, redis_server: RedisServer
) -> None:
    settings = Settings(
        database_url=database_url,
        redis_url=redis_server.url,
        queue=f"trainq-test-{uuid.uuid4().hex[:8]}",
    )
    r = redis_server.client()
    job_id = running_job(db, max_restarts=1)
    assert preempt(db, job_id, attempt=1, step=5, steps=[4, 5])
    with db.writer() as s:
        assert claim_job(s, job_id=job_id, worker="w2", device="cpu") is not None
    lose(db, job_id)
    # Attempt 2 followed a preemption: its loss is the first restart, within max_restarts 1.
    assert job_id in reconcile_once(db, r, settings).requeued
    with db.writer() as s:
        assert claim_job(s, job_id=job_id, worker="w3", device="cpu") is not None
    lose(db, job_id)
    assert job_id in reconcile_once(db, r, settings).failed  # the second restart is one too many
    with db.writer() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None and (job.status, job.error_code) == ("failed", "worker_lost")
    r.close()

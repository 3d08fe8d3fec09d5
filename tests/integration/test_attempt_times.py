"""Training hours outlive the jobs they came from (core.quotas, attempt_times), through the
store on SQLite and PostgreSQL: every way an attempt ends counts its time, and neither a
DELETE, the retention policy nor `trainq gc` gives any of it back; only time past any
trailing day goes."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import func, select, update

from core.config import Settings
from core.db import AttemptTime, Database, Job
from core.quotas import DAY_S, spans_by_owner, usage
from core.retention import collect, forget_spent_attempt_times, purge_job, retention_pass
from core.spec import JobSpec, JobStatus
from core.store import (
    claim_job,
    create_job,
    end_job,
    preempt_job,
    requeue_job,
    retry_job,
    succeed_job,
)
from core.store.deletion import delete_ended_job

FAR_AHEAD = dt.datetime(2999, 1, 1, tzinfo=dt.UTC)  # every heartbeat is older: lost


def owner() -> str:
    return f"k_{uuid.uuid4().hex[:16]}"


def queued(db: Database, of: str) -> str:
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec(), owner=of)
    return job_id


def claimed(db: Database, job_id: str) -> int:
    with db.writer() as s:
        job = claim_job(s, job_id=job_id, worker="w", device="cpu")
        assert job is not None
        return job.attempt


def entry(job_id: str, n: int) -> str:
    return f"{job_id}-a{n}"


def a_job_of_every_end(db: Database, of: str) -> list[str]:
    """Two jobs of `of`, seven attempts: retried, requeued as lost, handed back by a
    stopping worker, failed; canceled while running; succeeded; and one still running."""
    first, second, third = queued(db, of), queued(db, of), queued(db, of)
    n = claimed(db, first)
    with db.writer() as s:
        assert retry_job(s, job_id=first, attempt=n, queue_entry=entry(first, n))
    n = claimed(db, first)
    with db.writer() as s:
        assert requeue_job(
            s, job_id=first, attempt=n, queue_entry=entry(first, n), silent_since=FAR_AHEAD
        )
    n = claimed(db, first)
    with db.writer() as s:
        assert preempt_job(
            s,
            job_id=first,
            attempt=n,
            epoch=0,
            step=1,
            steps=[],
            checkpoint=b"checkpoint",
            queue_entry=entry(first, n),
        )
    n = claimed(db, first)
    with db.writer() as s:
        assert end_job(s, job_id=first, status=JobStatus.failed, code="x", attempt=n)
    n = claimed(db, second)
    with db.writer() as s:
        assert end_job(s, job_id=second, status=JobStatus.canceled, attempt=n)
        third_attempt = claim_job(s, job_id=third, worker="w", device="cpu")
        assert third_attempt is not None
        assert succeed_job(
            s, job_id=third, attempt=third_attempt.attempt, result={}, record={}, models=[]
        )
    running = queued(db, of)
    claimed(db, running)
    return [first, second, third, running]


def age(db: Database, of: str, hours: float) -> None:
    """Move every attempt of `of` `hours` back in time, each one hour long."""
    back = dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours)
    with db.writer() as s:
        s.execute(
            update(AttemptTime)
            .where(AttemptTime.owner == of)
            .values(started_at=back - dt.timedelta(hours=1), ended_at=back)
        )


def test_every_attempt_counts_however_it_ended(db: Database) -> None:
    of = owner()
    a_job_of_every_end(db, of)
    with db.reader() as s:
        spans = spans_by_owner(s, [of])[of]
    assert len(spans) == 7
    assert [sp.running for sp in spans].count(True) == 1


def test_deleting_and_purging_ended_jobs_gives_back_none_of_their_hours(db: Database) -> None:
    of = owner()
    *ended, running = a_job_of_every_end(db, of)
    age(db, of, 2)  # seven attempts of an hour each, ended two hours ago
    with db.reader() as s:
        before = usage(s, of).train_hours_24h
    assert before == pytest.approx(7, abs=0.01)
    with db.writer() as s:
        assert purge_job(s, job_id=ended[0])
    collect(db, older_than_days=0)  # `trainq gc` with no retention left: purges them all
    for job_id in ended:
        with db.writer() as s:
            assert delete_ended_job(s, job_id=job_id)
    with db.reader() as s:
        assert usage(s, of).train_hours_24h == pytest.approx(before, abs=0.01)
        assert s.get(Job, running) is not None


def test_only_attempts_past_any_trailing_day_are_forgotten(db: Database) -> None:
    recent, spent = owner(), owner()
    for of in (recent, spent):
        job_id = queued(db, of)
        n = claimed(db, job_id)
        with db.writer() as s:
            assert end_job(s, job_id=job_id, status=JobStatus.succeeded, attempt=n)
    age(db, recent, 23)
    age(db, spent, 2 * DAY_S / 3600 + 1)
    while forget_spent_attempt_times(db, limit=1):
        pass
    with db.reader() as s:
        kept = s.scalars(
            select(AttemptTime.owner)
            .where(AttemptTime.owner.in_([recent, spent]))
            .group_by(AttemptTime.owner)
            .having(func.count() > 0)
        ).all()
        assert kept == [recent]
        assert usage(s, recent).train_hours_24h == pytest.approx(1, abs=0.01)


def test_an_attempt_an_older_worker_left_open_ends_at_the_next_retention_pass(
    db: Database,
) -> None:
    """A worker of a trainq from before attempt_times ends its job, not its attempt: the
    retention pass ends such an attempt, and leaves a running one counting."""
    of = owner()
    left_open, running = queued(db, of), queued(db, of)
    claimed(db, left_open)
    claimed(db, running)
    with db.writer() as s:  # the older worker's end: the row alone
        s.execute(update(Job).where(Job.id == left_open).values(status=JobStatus.succeeded))
    retention_pass(db, Settings(database_url=str(db.engine.url)))
    with db.reader() as s:
        open_jobs = s.scalars(
            select(AttemptTime.job_id).where(
                AttemptTime.owner == of, AttemptTime.ended_at.is_(None)
            )
        ).all()
    assert open_jobs == [running]

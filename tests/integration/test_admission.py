"""Admission of a queue entry against a DELETE of its job at the same moment, driven through
the store from two connections (SQLite file and PostgreSQL): the worker's decision to read
or make the job's row and the deletion's are one transaction each, so the job stays
deleted whichever commits first."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis import Redis
from sqlalchemy import text
from sqlalchemy.orm import Session

import worker.admission
from core.config import Settings
from core.db import READ_ONLY, Database
from core.queue import VIA_API
from core.spec import JobSpec, JobStatus
from core.store import claim_job, create_job, end_job, get_job
from core.store.deletion import delete_ended_job, was_deleted
from tests.service import RedisServer, wait_until
from worker.admission import admit
from worker.attempt import Attempt, claim

SPEC = {"epochs": 1, "max_steps": 3}
# SQLite: a delete behind a write transaction waits unseen (BEGIN IMMEDIATE); this long
# shows it does not go first.
BLOCKED_DELETE_WAIT_S = 0.5


@pytest.fixture(scope="module")
def r(redis_server: RedisServer) -> Iterator[Redis]:
    client = redis_server.client()
    yield client
    client.close()


def ended_job(db: Database) -> str:
    """A job that ran and succeeded: one DELETE may remove."""
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec.model_validate(SPEC), owner="o")
        assert claim_job(s, job_id=job_id, worker="w", device="cpu") is not None
        assert end_job(s, job_id=job_id, status=JobStatus.succeeded)
    return job_id


def entry_of(db: Database, r: Redis, job_id: str, via: str | None) -> Attempt:
    """The job's own queue entry, as a worker took it."""
    return Attempt(
        job_id=job_id,
        queue_entry=job_id,
        raw_spec=SPEC,
        owner="o",
        via=via,
        worker="w2",
        settings=Settings(database_url=str(db.engine.url)),
        db=db,
        r=r,
        stop_asked=lambda: False,
    )


def waits_for_the_job_lock(db: Database) -> bool:
    """PostgreSQL: a transaction waits for an advisory lock another holds."""
    with db.reader() as s:
        waiting = s.scalar(
            text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        )
    return bool(waiting)


def read_only(s: Session) -> bool:
    return bool(s.connection().get_execution_options().get(READ_ONLY))


def delete_at_read(
    monkeypatch: pytest.MonkeyPatch, db: Database, other: Database, job_id: str, nth: int
) -> threading.Thread:
    """Right after admission's `nth` read of the job's row, a DELETE of the job runs from
    another connection; admission goes on once that delete has committed or waits for it."""
    real: Callable[..., Any] = worker.admission.get_job
    deleter = threading.Thread(target=delete_through, args=(other, job_id))
    reads = 0

    def read_then_delete(s: Session, *, job_id: str) -> Any:
        nonlocal reads
        row = real(s, job_id=job_id)
        reads += 1
        if reads == nth:
            deleter.start()
            if db.local:
                # A read-only session holds nothing a writer waits for: the delete commits.
                deleter.join(None if read_only(s) else BLOCKED_DELETE_WAIT_S)
            else:
                wait_until(
                    lambda: not deleter.is_alive() or waits_for_the_job_lock(other),
                    30,
                    "the delete to commit or wait",
                )
        return row

    monkeypatch.setattr(worker.admission, "get_job", read_then_delete)
    return deleter


def delete_through(db: Database, job_id: str) -> None:
    with db.writer() as s:
        assert delete_ended_job(s, job_id=job_id)


# A direct entry's admission reads the row once (then makes it); an API entry's first waits
# for the API's commit.
@pytest.mark.parametrize(("via", "nth"), [(None, 1), (VIA_API, 1), (VIA_API, 2)])
def test_a_delete_between_the_workers_reads_leaves_the_job_deleted(
    db: Database, r: Redis, monkeypatch: pytest.MonkeyPatch, via: str | None, nth: int
) -> None:
    job_id = ended_job(db)
    other = Database(str(db.engine.url))
    try:
        deleter = delete_at_read(monkeypatch, db, other, job_id, nth)
        a = entry_of(db, r, job_id, via)
        outcome = admit(a)
        deleter.join(60)
        assert not deleter.is_alive()
        monkeypatch.undo()
        # Either the worker saw the row first (the delete then took it, and the claim finds
        # nothing), or it saw the delete and refused the entry: never a row made again.
        if isinstance(outcome, dict):
            assert outcome["status"] == "refused", outcome
        assert claim(a) is None
        with db.reader() as s:
            assert get_job(s, job_id=job_id) is None
            assert was_deleted(s, job_id=job_id)
    finally:
        other.dispose()


def test_the_entry_of_a_job_deleted_before_admission_is_refused(db: Database, r: Redis) -> None:
    job_id = ended_job(db)
    delete_through(db, job_id)
    outcome = admit(entry_of(db, r, job_id, None))
    assert outcome == {"status": "refused", "error": "the job of this entry was deleted"}
    with db.reader() as s:
        assert get_job(s, job_id=job_id) is None

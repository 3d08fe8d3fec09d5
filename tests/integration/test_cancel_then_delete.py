"""A job deleted the moment its cancel commits: the cancel still tells Redis what it read in
its own transaction, and raises nothing (it once read the job again after the commit, and
answered 500 when the row was gone)."""

from __future__ import annotations

import pytest
from redis import Redis
from sqlalchemy import event
from sqlalchemy.orm import Session

from api.services import jobs
from core.db import Database, Job
from core.spec import JobStatus
from core.store.deletion import delete_ended_job
from core.stream import read
from tests.db import new_job
from tests.service import RedisServer


def test_a_cancel_whose_job_is_deleted_at_its_commit(
    db: Database, redis_server: RedisServer
) -> None:
    if db.engine.dialect.name == "sqlite":
        pytest.skip("SQLite's one writer: no other can delete before this session lets go")
    job_id = new_job(db)
    r = Redis.from_url(redis_server.url)
    with db.manual_session() as session:
        job = session.get(Job, job_id)
        assert job is not None

        @event.listens_for(session, "after_commit", once=True)
        def delete_it(_: Session) -> None:  # another request's DELETE, between the two
            with db.writer() as other:
                assert delete_ended_job(other, job_id=job_id)

        assert jobs.cancel(session, r, job) is JobStatus.canceled
    with db.reader() as s:
        assert s.get(Job, job_id) is None
    [(_, kind, data)] = read(r, job_id, None, 10)
    assert (kind, data["status"]) == ("status", JobStatus.canceled)

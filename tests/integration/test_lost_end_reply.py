"""An attempt whose own end committed with its reply lost (the epoch transaction that pruned
its trial, say), then retried, finds the job ended under its own number: it publishes that
end to the job's stream, so followers see it at once. A job another attempt owns now is left
to that attempt. SQLite and PostgreSQL, a real redis-server."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from redis import Redis

from core.config import Settings
from core.db import Database
from core.errors import JobSuperseded
from core.spec import JobStatus
from core.store import end_job
from core.stream import read
from tests.db import running_job
from tests.service import RedisServer
from worker.attempt import Attempt
from worker.execution import _superseded


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[Redis]:
    client = redis_server.client()
    yield client
    client.close()


def attempt(db: Database, r: Redis, job_id: str, number: int) -> Attempt:
    return Attempt(
        job_id=job_id, queue_entry=job_id, raw_spec={}, owner="o", via=None, worker="w",
        settings=Settings(), db=db, r=r, stop_asked=lambda: False, number=number,
    )  # fmt: skip


def statuses(r: Redis, job_id: str) -> list[dict[str, Any]]:
    return [data for _, kind, data in read(r, job_id, None, 100) if kind == "status"]


def test_its_own_end_is_published(db: Database, r: Redis) -> None:
    job_id = running_job(db)
    with db.writer() as s:  # the commit that landed, its reply lost
        end_job(
            s, job_id=job_id, status=JobStatus.pruned, code="pruned", message="behind",
            from_statuses=(JobStatus.running,), attempt=1,
        )  # fmt: skip
    rec: Any = SimpleNamespace(last_step=7)
    out = _superseded(attempt(db, r, job_id, 1), rec, JobSuperseded("no longer owns it"))
    assert out == {"status": "pruned"}
    (status,) = statuses(r, job_id)
    assert status["status"] == "pruned" and status["error"]["code"] == "pruned"


def test_a_job_another_attempt_owns_is_left_alone(db: Database, r: Redis) -> None:
    job_id = running_job(db)  # attempt 1 runs it; attempt 0 (a stale one) finds it gone
    rec: Any = SimpleNamespace(last_step=7)
    out = _superseded(attempt(db, r, job_id, 2), rec, JobSuperseded("no longer owns it"))
    assert out == {"status": "superseded"}
    assert statuses(r, job_id) == []

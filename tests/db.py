"""A database at head for tests that drive the store directly, and the jobs they start from."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from core.db import Database
from core.schema import upgrade
from core.spec import JobSpec
from core.store import claim_job, create_job


@contextlib.contextmanager
def migrated(database_url: str, busy_timeout_s: float = 15.0) -> Iterator[Database]:
    """The database at `database_url`, upgraded to head (15 s is Database's own wait for a
    SQLite lock)."""
    upgrade(database_url)
    database = Database(database_url, busy_timeout_s=busy_timeout_s)
    try:
        yield database
    finally:
        database.dispose()


def new_job(db: Database, **spec: object) -> str:
    """A queued job of `spec` (the defaults where empty)."""
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec.model_validate(spec), owner="o")
    return job_id


def running_job(db: Database, worker: str = "w1", **spec: object) -> str:
    """A job of `spec` that `worker` has claimed: its attempt 1 is running."""
    job_id = new_job(db, **spec)
    with db.writer() as s:
        assert claim_job(s, job_id=job_id, worker=worker, device="cpu") is not None
    return job_id

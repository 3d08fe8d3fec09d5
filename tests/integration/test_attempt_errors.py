"""What a user is told when an attempt's database write is refused: a clear `internal`
error that names the database's reason, never the statement or the bytes it carried; and
which refusals are waited out instead (a full disk, a lost connection)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from core.db import Database
from core.schema import upgrade
from core.spec import JobSpec
from core.store import claim_job, create_job, get_job, latest_checkpoint, save_epoch
from core.train import EpochMetrics
from worker.execution import unexpected_error
from worker.retry import DatabaseAway, retry_write

BLOB_LIMIT = 1 << 20


def test_a_checkpoint_over_the_blob_limit_is_internal_with_the_databases_reason(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'trainq.db'}"
    upgrade(url)
    db = Database(url)

    @event.listens_for(db.engine, "connect")
    def _small_blobs(dbapi_conn: Any, _record: Any) -> None:
        # A database whose size limit a checkpoint passes (SQLite's default is 1 GB).
        dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, BLOB_LIMIT)

    job_id = str(uuid.uuid4())
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec(), owner=None)
    with db.writer() as s:
        claim_job(s, job_id=job_id, worker="w", device="cpu")
    epoch = EpochMetrics(1, 10, 0.5, 0.9, 0.4, 0.9, 1.0, 100.0)
    with pytest.raises(SQLAlchemyError) as refused, db.writer() as s:
        save_epoch(
            s,
            job_id=job_id,
            attempt=1,
            epoch=epoch,
            steps=[],
            checkpoint=b"\x01" * (2 * BLOB_LIMIT),
        )
    db.dispose()
    error = unexpected_error(refused.value)
    assert error.code == "internal"
    assert "database write" in error.message and "too big" in error.message
    assert "INSERT" not in error.message and "\\x01" not in error.message
    assert len(error.message) < 700


@pytest.fixture
def claimed(tmp_path: Path) -> Iterator[tuple[Database, str]]:
    """A job whose attempt 1 is running, in a SQLite file."""
    url = f"sqlite:///{tmp_path / 'trainq.db'}"
    upgrade(url)
    db = Database(url)
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec(), owner=None)
    with db.writer() as s:
        claim_job(s, job_id=job_id, worker="w", device="cpu")
    yield db, job_id
    db.dispose()


def epoch_write(job_id: str, full_for: int) -> tuple[Callable[[Session], None], list[int]]:
    """An epoch's write (a 256 KiB checkpoint) that finds the disk full its first `full_for`
    times: SQLite's max_page_count at the file's size is a disk with no room left."""
    calls: list[int] = []

    def write(s: Session) -> None:
        calls.append(1)
        pages = 1 if len(calls) <= full_for else 1 << 30  # 1: no page beyond what is there
        s.execute(text(f"PRAGMA max_page_count = {pages}"))
        epoch = EpochMetrics(1, 10, 0.5, 0.9, 0.4, 0.9, 1.0, 100.0)
        save_epoch(
            s, job_id=job_id, attempt=1, epoch=epoch, steps=[], checkpoint=b"\x01" * (1 << 18)
        )

    return write, calls


def test_a_full_disk_during_an_epoch_write_is_waited_out(claimed: tuple[Database, str]) -> None:
    db, job_id = claimed
    write, calls = epoch_write(job_id, full_for=2)
    retry_write(write, db, 30.0, "the epoch")
    assert len(calls) == 3
    with db.writer() as s:
        checkpoint = latest_checkpoint(s, job_id=job_id)
        assert checkpoint is not None and checkpoint.epoch == 1


def test_a_disk_that_stays_full_gives_the_attempt_up_not_the_job(
    claimed: tuple[Database, str],
) -> None:
    db, job_id = claimed
    write, calls = epoch_write(job_id, full_for=1 << 30)
    with pytest.raises(DatabaseAway, match="database or disk is full"):
        retry_write(write, db, 0.5, "the epoch")
    assert len(calls) > 1
    with db.writer() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None and job.status == "running" and job.attempt == 1
        assert latest_checkpoint(s, job_id=job_id) is None


def test_a_refusal_that_would_come_back_is_not_retried(claimed: tuple[Database, str]) -> None:
    db = claimed[0]
    calls: list[int] = []

    def write(s: Session) -> None:
        calls.append(1)
        s.execute(text("INSERT INTO no_such_table VALUES (1)"))

    with pytest.raises(SQLAlchemyError, match="no such table"):
        retry_write(write, db, 30.0, "the epoch")
    assert len(calls) == 1

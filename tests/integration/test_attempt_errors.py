"""What a user is told when an attempt's database write is refused: a clear `internal`
error that names the database's reason, never the statement or the bytes it carried."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError

from core.db import Database
from core.migrate import upgrade
from core.spec import JobSpec
from core.store import claim_job, create_job, save_epoch
from core.train import EpochMetrics
from worker.tasks import _unexpected

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
    with db.session() as s:
        create_job(s, job_id=job_id, spec=JobSpec(), owner=None)
    with db.session() as s:
        claim_job(s, job_id=job_id, worker="w", device="cpu")
    epoch = EpochMetrics(1, 10, 0.5, 0.9, 0.4, 0.9, 1.0, 100.0)
    with pytest.raises(SQLAlchemyError) as refused, db.session() as s:
        save_epoch(
            s,
            job_id=job_id,
            attempt=1,
            epoch=epoch,
            steps=[],
            checkpoint=b"\x01" * (2 * BLOB_LIMIT),
        )
    db.dispose()
    error = _unexpected(refused.value)
    assert error.code == "internal"
    assert "database write" in error.message and "too big" in error.message
    assert "INSERT" not in error.message and "\\x01" not in error.message
    assert len(error.message) < 700

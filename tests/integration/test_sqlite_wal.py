"""SQLite's write-ahead log stays bounded: it is cut back to WAL_SIZE_LIMIT_BYTES once
checkpointed, and a write that fails for lack of space leaves no frames of its own in it."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

import core.db.sqlite
from core.db import Database
from worker.retry import DatabaseAway, retry_write

BLOB = 64 * 1024


@pytest.fixture
def pinned(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A connection held open throughout, as a running service's pool holds one: the last
    connection to close would checkpoint the log and delete it."""
    conn = sqlite3.connect(tmp_path / "trainq.db")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE pin (x INTEGER)")  # this connection now has the log open
    conn.commit()
    yield conn
    conn.close()


def _database(tmp_path: Path) -> tuple[Database, Path]:
    path = tmp_path / "trainq.db"
    db = Database(f"sqlite:///{path}")
    with db.writer() as s:
        s.execute(text("CREATE TABLE blobs (b BLOB NOT NULL)"))
    return db, Path(f"{path}-wal")


def _insert(db: Database, nbytes: int) -> None:
    with db.writer() as s:
        for _ in range(nbytes // BLOB):
            s.execute(text("INSERT INTO blobs (b) VALUES (randomblob(:n))"), {"n": BLOB})


def test_journal_size_limit_is_set_on_every_connection(tmp_path: Path) -> None:
    db, _wal = _database(tmp_path)
    try:
        with db.reader() as s:
            limit = s.execute(text("PRAGMA journal_size_limit")).scalar_one()
        assert limit == core.db.sqlite.WAL_SIZE_LIMIT_BYTES
        assert limit > 0
    finally:
        db.dispose()


def test_wal_is_cut_back_after_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned: sqlite3.Connection
) -> None:
    monkeypatch.setattr(core.db.sqlite, "WAL_SIZE_LIMIT_BYTES", 1 * 2**20)
    db, wal = _database(tmp_path)
    try:
        _insert(db, 8 * 2**20)  # one transaction of 8 MiB: the log grows to hold it
        assert wal.stat().st_size > 8 * 2**20
        with db.writer() as s:  # the log, checkpointed at the commit above, starts over
            s.execute(text("INSERT INTO blobs (b) VALUES (x'00')"))
        assert wal.stat().st_size <= 1 * 2**20
    finally:
        db.dispose()


def test_a_write_failing_for_lack_of_space_leaves_the_wal_empty(
    tmp_path: Path, pinned: sqlite3.Connection
) -> None:
    db, wal = _database(tmp_path)
    try:
        _insert(db, 256 * 1024)
        with db.reader() as s:
            pages = s.execute(text("PRAGMA page_count")).scalar_one()

        # The database may grow by 8 MiB at most: a write of 16 MiB spills most of what it
        # wrote into the log (the page cache holds 2 MiB) and then fails: SQLITE_FULL.
        @event.listens_for(db.engine, "connect")
        def _cap(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA max_page_count={pages + 2048}")
            cur.close()

        with pytest.raises(OperationalError, match="database or disk is full"):
            _insert(db, 16 * 2**20)
        assert os.path.getsize(wal) == 0
        # and the database is whole: what was committed before is all still there
        with db.reader() as s:
            assert s.execute(text("SELECT count(*) FROM blobs")).scalar_one() == 4
            assert s.execute(text("PRAGMA integrity_check")).scalar_one() == "ok"
    finally:
        db.dispose()


def test_a_worker_write_retried_on_a_full_disk_leaves_the_wal_empty(
    tmp_path: Path, pinned: sqlite3.Connection
) -> None:
    db, wal = _database(tmp_path)
    try:
        with db.reader() as s:
            pages = s.execute(text("PRAGMA page_count")).scalar_one()

        @event.listens_for(db.engine, "connect")
        def _cap(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA max_page_count={pages + 1024}")
            cur.close()

        def write(s: Session) -> None:
            for _ in range(8 * 2**20 // BLOB):
                s.execute(text("INSERT INTO blobs (b) VALUES (randomblob(:n))"), {"n": BLOB})

        with pytest.raises(DatabaseAway, match="database or disk is full"):
            retry_write(write, db, for_s=0.5, what="a checkpoint's write")
        assert os.path.getsize(wal) == 0
    finally:
        db.dispose()

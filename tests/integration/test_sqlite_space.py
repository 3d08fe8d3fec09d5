"""The space of purged data given back to the disk on SQLite: `trainq gc` and the retention
pass shrink the file (its log included), `trainq gc` reports the sizes it measured, and a
database created before pages were freed incrementally is rewritten once by `--vacuum`."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.config import Settings
from core.db import Database
from core.retention import retention_pass
from tests.db import migrated
from tests.integration.test_retention import ended_job, gc

MODEL = 2**20
JOBS = 16  # 16 MiB of models, purged
PURGE = ("--older-than-days", "5")


def sizes_line(out: str) -> tuple[int, int]:
    line = next(x for x in out.splitlines() if x.startswith("database file and log:"))
    words = line.split()
    return int(words[4]), int(words[7])


def fill(db: Database) -> None:
    with db.writer() as s:
        for _ in range(JOBS):
            ended_job(s, days_ago=10, steps=10, model=MODEL)


def file_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def checkpointed_bytes(path: Path) -> int:
    """The file and its log once the log is checkpointed: what the disk holds at rest."""
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return file_bytes(path)


@pytest.fixture
def new_db(tmp_path: Path) -> Iterator[tuple[Path, Database]]:
    path = tmp_path / "trainq.db"
    with migrated(f"sqlite:///{path}") as db:
        yield path, db


@pytest.fixture
def older_db(tmp_path: Path) -> Iterator[tuple[Path, Database]]:
    """A database as an older trainq created it: no incremental freeing of pages."""
    path = tmp_path / "trainq.db"
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA auto_vacuum=NONE")
        c.execute("CREATE TABLE older (x)")  # a table first: the mode is fixed from here on
    with migrated(f"sqlite:///{path}") as db:
        yield path, db


def test_gc_gives_the_purged_bytes_back_to_the_disk_and_says_how_many(
    new_db: tuple[Path, Database],
) -> None:
    path, db = new_db
    fill(db)
    db.dispose()
    full = checkpointed_bytes(path)
    out = gc(db, *PURGE)
    before, after = sizes_line(out)
    assert before >= full and after == file_bytes(path), out
    assert full - after > (JOBS - 1) * MODEL, out  # the models' pages left the file
    assert "stay in the file" not in out, out


def test_the_retention_pass_gives_the_purged_bytes_back(new_db: tuple[Path, Database]) -> None:
    path, db = new_db
    fill(db)
    full = checkpointed_bytes(path)
    retention_pass(db, Settings(retention_days=5, retention_batch=JOBS))
    db.dispose()
    assert full - checkpointed_bytes(path) > (JOBS - 1) * MODEL


def test_an_older_database_is_told_to_vacuum_and_vacuum_gives_the_bytes_back(
    older_db: tuple[Path, Database],
) -> None:
    path, db = older_db
    fill(db)
    db.dispose()
    full = checkpointed_bytes(path)
    out = gc(db, *PURGE)
    assert "stay in the file" in out and "trainq gc --vacuum" in out, out
    assert full - checkpointed_bytes(path) < MODEL  # nothing came back without --vacuum
    out = gc(db, *PURGE, "--vacuum")
    before, after = sizes_line(out)
    assert before - after > (JOBS - 1) * MODEL and "stay in the file" not in out, out
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA auto_vacuum").fetchone() == (2,)  # incremental from now on

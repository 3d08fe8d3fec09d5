"""SQLite engines: WAL, a busy timeout, writers that take turns (BEGIN IMMEDIATE behind a
per-process lock) and read-only sessions that never wait, a log that gives its space back
after a full disk, and the free pages of the file given back to the disk (reclaim_space).
See docs/operations.md."""

from __future__ import annotations

import logging
import sqlite3
import threading
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool, QueuePool

log = logging.getLogger("trainq.db")

# The execution option of a read-only session (core.db.Database.reader): SQLite begins it
# DEFERRED, so that in WAL mode it never waits for a writer.
READ_ONLY = "trainq_read_only"

# SQLite's write-ahead log is cut back to this size whenever it starts over after a
# checkpoint (PRAGMA journal_size_limit); without it the file keeps the size of the largest
# transaction it ever held (a model, a checkpoint), space a full disk needs back.
WAL_SIZE_LIMIT_BYTES = 64 * 2**20

_DISK_FULL = "disk_full"  # a connection's info: one of its statements found no space left


def make_sqlite_engine(url: str, *, busy_timeout_s: float, pooled: bool) -> Engine:
    """WAL, a busy timeout, and BEGIN IMMEDIATE for transactions that may write, so that two
    writers queue up instead of failing later with 'database is locked'; read-only sessions
    begin DEFERRED and, in WAL mode, never wait for a writer. `pooled` keeps connections
    open between uses (the API); the default opens one per use, which is safe across the
    workers' forks."""
    engine = create_engine(
        url,
        poolclass=QueuePool if pooled else NullPool,
        connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
        **({"pool_size": 40, "max_overflow": 24} if pooled else {}),  # 40: the thread pool
    )
    hooks = _Hooks(busy_timeout_s)
    event.listen(engine, "connect", hooks.on_connect)
    event.listen(engine, "begin", hooks.on_begin)
    event.listen(engine, "handle_error", hooks.on_error)
    event.listen(engine, "checkin", hooks.on_checkin)
    event.listen(engine, "invalidate", hooks.on_invalidate)
    return engine


class _Hooks:
    """The engine's event handlers: each connection's pragmas, the writers' turns, and the
    log emptied after a write that found the disk full."""

    def __init__(self, busy_timeout_s: float) -> None:
        self.busy_timeout_s = busy_timeout_s
        self.writer = _WriterLock(busy_timeout_s)

    def on_connect(self, dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let us issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        # First, before WAL writes the file's header: a new database then frees pages
        # incrementally (reclaim_space); an older one only after its next VACUUM.
        # The wait for a lock first: the pragmas after it may need one.
        cur.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        cur.close()

    def on_begin(self, conn: Any) -> None:
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
            return
        self.writer.acquire(conn.info)
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    def on_error(self, context: Any) -> None:
        if _is_full(context.original_exception) and context.connection is not None:
            context.connection.info[_DISK_FULL] = True

    def on_checkin(self, dbapi_conn: Any, record: Any) -> None:
        self.writer.release(record.info)
        full = record.info.pop(_DISK_FULL, False)
        if full and dbapi_conn is not None:  # rolled back by now (checkin follows reset)
            _empty_wal(dbapi_conn, self.busy_timeout_s)

    def on_invalidate(self, _dbapi_conn: Any, record: Any, _exc: Any) -> None:
        self.writer.release(record.info)


def _is_full(e: BaseException) -> bool:
    return isinstance(e, sqlite3.OperationalError) and "database or disk is full" in str(e)


def _empty_wal(dbapi_conn: Any, busy_timeout_s: float) -> None:
    """After a write that failed for lack of space (SQLITE_FULL), and once it is rolled back:
    checkpoint the log and truncate it to nothing, so that the frames the failed write
    spilled into it give their space back instead of growing the log on every retry. Best
    effort, and without waiting: a reader still on an older snapshot leaves the log as it
    is (journal_size_limit cuts it back at a later checkpoint)."""
    try:
        cur = dbapi_conn.cursor()
    except sqlite3.Error:
        return  # closed already: nothing to checkpoint through it
    try:
        cur.execute("PRAGMA busy_timeout=0")
        busy, frames, done = cur.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            log.warning(
                "the database's log could not be emptied after a full disk "
                "(%d of %d frames checkpointed)",
                done,
                frames,
            )
    except sqlite3.Error as e:
        log.warning("emptying the database's log after a full disk failed: %s", e)
    finally:
        with suppress(sqlite3.Error):  # else the pool drops the connection on its next error
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cur.close()


class _WriterLock:
    """SQLite admits one writer at a time, and a writer that finds the database locked polls
    it with ever longer sleeps, and may sleep on well after the database is free.
    Writers of one process therefore queue on this lock first, and are handed the database
    in turn; only writers of other processes still meet the busy timeout. A connection
    holds the lock from BEGIN IMMEDIATE until it is returned to the pool (the end of its
    session's transaction)."""

    def __init__(self, timeout_s: float) -> None:
        self._lock = threading.Lock()
        self._timeout_s = timeout_s

    def acquire(self, info: dict[str, Any]) -> None:
        if info.get("writer"):
            return  # this connection already holds it (a second transaction before checkin)
        if not self._lock.acquire(timeout=self._timeout_s):
            raise OperationalError("BEGIN IMMEDIATE", {}, TimeoutError("database is locked"))
        info["writer"] = True

    def release(self, info: dict[str, Any]) -> None:
        if info.pop("writer", False):
            self._lock.release()


INCREMENTAL = 2  # PRAGMA auto_vacuum's answer for INCREMENTAL (0: none, 1: full)
# Free pages an incremental vacuum gives back in one write transaction: a few MiB, so that
# the service's writers wait for one step at most, never for the whole file.
PAGES_PER_STEP = 2048


@dataclass(frozen=True)
class FileSpace:
    """What the disk got back: the database file and its log, in bytes, before and after,
    and the free pages left inside the file (an older database not vacuumed yet)."""

    before: int
    after: int
    free_left: int
    vacuumed: bool  # a full VACUUM rewrote the file


def reclaim_space(engine: Engine, *, full: bool = False) -> FileSpace:
    """Give the file's free pages back to the disk, then checkpoint the log and truncate it.
    A database that frees pages incrementally does it a step at a time while the service
    runs; an older one (auto_vacuum none) only through one full VACUUM (`full`), which
    rewrites the file, takes the write lock for its whole length and turns incremental
    freeing on: its pages stay in the file otherwise, and free_left says how many bytes."""
    path = Path(engine.url.database or "")
    before = file_bytes(path)
    raw = engine.raw_connection()
    try:
        with closing(raw.cursor()) as cur:
            vacuumed = False
            if _scalar(cur, "PRAGMA auto_vacuum") != INCREMENTAL and full:
                cur.execute("VACUUM")  # the pending auto_vacuum=INCREMENTAL takes effect
                vacuumed = True
            _free_pages(cur)
            free_left = _scalar(cur, "PRAGMA freelist_count") * _scalar(cur, "PRAGMA page_size")
            cur.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        raw.close()
    return FileSpace(before, file_bytes(path), free_left, vacuumed)


def free_pages(engine: Engine) -> None:
    """The file's free pages given back to the disk, a step at a time (the retention pass's,
    after a purge); nothing on a database that does not free pages incrementally."""
    raw = engine.raw_connection()
    try:
        with closing(raw.cursor()) as cur:
            _free_pages(cur)
    finally:
        raw.close()


def _free_pages(cur: Any) -> None:
    if _scalar(cur, "PRAGMA auto_vacuum") != INCREMENTAL:
        return
    while _scalar(cur, "PRAGMA freelist_count"):
        # Each freed page is a row of the answer: read them all, or one page alone goes.
        cur.execute(f"PRAGMA incremental_vacuum({PAGES_PER_STEP})").fetchall()


def file_bytes(path: Path) -> int:
    """The bytes a SQLite database takes on disk: its file and its write-ahead log."""
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def _scalar(cur: Any, sql: str) -> int:
    return int(cur.execute(sql).fetchone()[0])

"""The database: SQLAlchemy models (the source of truth for jobs, results and artifacts) and
the engine. The schema changes only through the Alembic migrations in `migrations/`."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.pool import NullPool, QueuePool
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ColumnElement, FunctionElement, literal

from core.config import Settings
from core.spec import JobStatus

log = logging.getLogger("trainq.db")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class _DbNow(FunctionElement[dt.datetime]):
    type = DateTime(timezone=True)
    inherit_cache = True


class _DbAgo(FunctionElement[dt.datetime]):
    type = DateTime(timezone=True)
    inherit_cache = True


def db_now() -> _DbNow:
    """The database's clock, now. Every time that liveness is judged by (heartbeat_at,
    enqueued_at, started_at) is written and compared with this one clock: the hosts that
    write them and the reconcilers that read them may each be minutes off."""
    return _DbNow()


def db_ago(seconds: float) -> _DbAgo:
    """The database's clock, `seconds` ago."""
    return _DbAgo(literal(seconds, Float()))


# A time that stored times are compared with: the database's clock (db_now, db_ago) in
# trainq's own comparisons; a plain value where a caller means a fixed instant.
DbTime = dt.datetime | ColumnElement[dt.datetime]


# SQLite's CURRENT_TIMESTAMP has whole seconds; this is the text SQLAlchemy stores a
# datetime as (UTC, microseconds), so stored times of either origin compare as text.
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f000', {})"


@compiles(_DbNow, "sqlite")
def _sqlite_now(_element: _DbNow, _compiler: SQLCompiler, **_kw: Any) -> str:
    return _SQLITE_NOW.format("'now'")


@compiles(_DbAgo, "sqlite")
def _sqlite_ago(element: _DbAgo, compiler: SQLCompiler, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return _SQLITE_NOW.format(f"julianday('now') - {seconds} / 86400.0")


# PostgreSQL's now() is the start of the transaction, which may have waited on a row lock
# for longer than the heartbeat timeout; clock_timestamp() is the time of the write.
@compiles(_DbNow, "postgresql")
def _postgres_now(_element: _DbNow, _compiler: SQLCompiler, **_kw: Any) -> str:
    return "clock_timestamp()"


@compiles(_DbAgo, "postgresql")
def _postgres_ago(element: _DbAgo, compiler: SQLCompiler, **kw: Any) -> str:
    return f"clock_timestamp() - make_interval(secs => {compiler.process(element.clauses, **kw)})"


def as_utc(t: dt.datetime | None) -> dt.datetime | None:
    """SQLite hands back naive datetimes; every time trainq stores is UTC."""
    return t.replace(tzinfo=dt.UTC) if t is not None and t.tzinfo is None else t


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        dt.datetime: DateTime(timezone=True),
    }


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
        Index("ix_jobs_created", "created_at", "id"),
        Index("ix_jobs_status", "status"),
        Index("ix_jobs_owner_status", "owner", "status"),
        Index("uq_jobs_sweep_trial", "sweep_id", "trial_number", unique=True),
        # The retention pass's (core.retention.expired): ended, not purged, oldest first.
        Index(
            "ix_jobs_unpurged_finished",
            "finished_at",
            sqlite_where=text("purged_at IS NULL"),
            postgresql_where=text("purged_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.queued)
    spec: Mapped[dict[str, Any]]
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    heartbeat_at: Mapped[dt.datetime | None]
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Attempts that a stopping worker handed back (SIGTERM): not restarts (worker.reconciler).
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    # The attempt whose worker was asked to stop (SIGTERM), written as the request arrives:
    # should it die before it hands the job back, that loss is a preemption too.
    stop_requested_attempt: Mapped[int | None]
    worker: Mapped[str | None] = mapped_column(String(200))
    device: Mapped[str | None] = mapped_column(String(200))
    total_steps: Mapped[int | None]
    progress_step: Mapped[int] = mapped_column(Integer, default=0)  # last step stored in DB
    progress_epoch: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    queue_entry: Mapped[str | None] = mapped_column(String(80))  # the RQ job id that carries it
    # core.spec.SPEC_VERSION of the code that wrote the row's spec (None: before 0012)
    spec_version: Mapped[str | None] = mapped_column(String(12))
    # core.spec.Priority.rank of the spec's priority: orders an owner's own queued jobs.
    priority: Mapped[int] = mapped_column(Integer, default=0)
    # When the retention policy (or `trainq gc`) removed this ended job's step rows,
    # checkpoint and artifacts; the row and its epochs stay.
    purged_at: Mapped[dt.datetime | None]
    enqueued_at: Mapped[dt.datetime | None] = mapped_column(default=db_now())
    result: Mapped[dict[str, Any] | None]
    record: Mapped[dict[str, Any] | None]
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    # A sweep's trial (core.sweeps): its sweep, its number there, the values the search
    # chose (also in `spec`), and what the sampler and pruner keep on it (Optuna's
    # system attributes).
    sweep_id: Mapped[str | None] = mapped_column(String(36))
    trial_number: Mapped[int | None]
    trial_params: Mapped[dict[str, Any] | None]
    trial_attrs: Mapped[dict[str, Any] | None]


class Sweep(Base):
    """A search over job specs (core.sweeps): its trials are jobs naming it."""

    __tablename__ = "sweeps"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_sweeps_owner_idempotency_key"),
        Index("ix_sweeps_owner_created", "owner", "created_at"),
        Index("ix_sweeps_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    # Whose quotas its trials count against when the search queues them: the creator's
    # owner, or None for an admin's (api.auth.Caller.quota_owner).
    quota_owner: Mapped[str | None] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]]  # core.sweeps.spec.SweepSpec, as submitted
    status: Mapped[str] = mapped_column(String(16))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    trials_created: Mapped[int] = mapped_column(Integer, default=0)
    # Why the last top-up queued fewer trials than it wanted (a quota), or None.
    waiting: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None]


class DeletedJob(Base):
    """A job deleted with DELETE /jobs/{id}: a worker that took one of its queue entries just
    before the delete refuses it rather than make the job again from the entry. Kept
    DELETED_JOB_DAYS (core.store.deletion), far past any such race."""

    __tablename__ = "deleted_jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    deleted_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class AttemptTime(Base):
    """One attempt's time on a worker, as max_train_hours_per_day and fair share count it
    (core.quotas): started in the transaction that claims the job, ended in the one that
    moves the job off running (ended, requeued, handed back). No key to the job: the time
    outlives the job's row (a DELETE, the retention policy), so that deleting a job gives
    back none of its hours. Rows that ended past the quota's day go (core.retention)."""

    __tablename__ = "attempt_times"
    __table_args__ = (
        Index("ix_attempt_times_owner_ended", "owner", "ended_at"),
        Index("ix_attempt_times_job_ended", "job_id", "ended_at"),
        Index("ix_attempt_times_ended", "ended_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(36))
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[dt.datetime]
    ended_at: Mapped[dt.datetime | None]  # None while the attempt runs


class Quota(Base):
    """One owner's limits where they differ from the defaults in Settings (core.quotas).
    `limits` holds only the limits overridden; null in it means no limit."""

    __tablename__ = "quotas"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    limits: Mapped[dict[str, Any]]
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class EpochMetric(Base):
    __tablename__ = "epoch_metrics"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int]
    train_loss: Mapped[float] = mapped_column(Float)
    train_accuracy: Mapped[float] = mapped_column(Float)
    test_loss: Mapped[float] = mapped_column(Float)
    test_accuracy: Mapped[float] = mapped_column(Float)
    duration_s: Mapped[float] = mapped_column(Float)
    images_per_second: Mapped[float] = mapped_column(Float)


class StepMetric(Base):
    """Per-batch history, written once per epoch (with that epoch's checkpoint), so that it
    outlives the bounded Redis stream. Its columns are core.train's StepMetrics, written out
    so that the database imports no torch (tests/unit/test_step_record.py keeps them equal)."""

    __tablename__ = "step_metrics"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int]
    loss: Mapped[float] = mapped_column(Float)
    lr: Mapped[float] = mapped_column(Float)
    images_per_second: Mapped[float] = mapped_column(Float)
    memory_allocated: Mapped[int] = mapped_column(BigInteger)
    memory_reserved: Mapped[int] = mapped_column(BigInteger)
    memory_peak: Mapped[int] = mapped_column(BigInteger)
    time: Mapped[float] = mapped_column(Float)


class Checkpoint(Base):
    """The latest checkpoint of a job: what a requeued job resumes from. Written at the end
    of each epoch, and mid-epoch (at `step`, inside `epoch`) when its worker stopped."""

    __tablename__ = "checkpoints"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    epoch: Mapped[int]
    step: Mapped[int]
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Artifact(Base):
    """One format of a job's model (core.spec.ExportFormat), verified when it was stored."""

    __tablename__ = "artifacts"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    format: Mapped[str] = mapped_column(String(32), primary_key=True)
    # Read only when used (a download's body, predict's load): HEAD, 304 and listings never
    # hold a model in memory.
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class UserDataset(Base):
    """A data set uploaded with POST /datasets, in its canonical .npz form (core.datasets).
    Immutable once stored. `data` is loaded only when read (the worker's copy)."""

    __tablename__ = "datasets"
    __table_args__ = (Index("ix_datasets_owner_created", "owner", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    image_shape: Mapped[list[int]] = mapped_column(JSON)  # [C, H, W]
    num_classes: Mapped[int] = mapped_column(Integer)
    train_count: Mapped[int] = mapped_column(Integer)
    test_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)


READ_ONLY = "trainq_read_only"


@dataclass(frozen=True)
class DbTimeouts:
    """How long trainq waits on PostgreSQL (Settings.db_*_timeout_s; core.postgres).
    `statement_s` None: no bound on a statement (migrations, which an operator runs and
    which may be long)."""

    connect_s: float = 5.0
    statement_s: float | None = 15.0
    pool_s: float = 5.0


# The slowest transfer rate a healthy database link is assumed to keep up: the time a
# statement that moves a large value may take beyond the usual bound.
SLOWEST_BYTES_PER_S = 8 * 2**20


def statement_bound(timeouts: DbTimeouts, extra_s: float = 0.0) -> float | None:
    """How long the client waits for any one answer: the server's own statement timeout
    plus a connection's worth of time for the answer to arrive."""
    if timeouts.statement_s is None:
        return None
    return timeouts.statement_s + extra_s + timeouts.connect_s


def allow_time_for(s: Session, nbytes: int) -> None:
    """Give the rest of this transaction's statements time to move `nbytes` (a model, a
    checkpoint, a data set) at SLOWEST_BYTES_PER_S, beyond the usual bound. PostgreSQL
    only (core.postgres): SQLite has no statement bound."""
    if s.get_bind().dialect.name != "postgresql":
        return
    raw: Any = s.connection().connection.dbapi_connection
    timeouts: DbTimeouts | None = getattr(raw, "timeouts", None)
    if timeouts is None or timeouts.statement_s is None:
        return
    extra_s = nbytes / SLOWEST_BYTES_PER_S
    statement_ms = round((timeouts.statement_s + extra_s) * 1000)
    s.execute(text(f"SET LOCAL statement_timeout = {statement_ms}"))
    raw.bound_s = statement_bound(timeouts, extra_s)


# SQLite's write-ahead log is cut back to this size whenever it starts over after a
# checkpoint (PRAGMA journal_size_limit); without it the file keeps the size of the largest
# transaction it ever held (a model, a checkpoint), space a full disk needs back.
WAL_SIZE_LIMIT_BYTES = 64 * 2**20


def make_engine(
    url: str,
    *,
    busy_timeout_s: float = 15.0,
    pooled: bool = False,
    timeouts: DbTimeouts | None = None,
) -> Engine:
    """SQLite: WAL, a busy timeout, and BEGIN IMMEDIATE for transactions that may write, so
    that two writers queue up instead of failing later with 'database is locked'; read-only
    sessions (`Database.reader`) begin DEFERRED and, in WAL mode, never wait for a writer.
    `pooled` keeps connections open between uses (the API); the default opens one per use,
    which is safe across the workers' forks. PostgreSQL: a pooled engine whose every wait
    on the server is bounded by `timeouts` (core.postgres)."""
    if not url.startswith("sqlite"):
        from core.postgres import make_postgres_engine  # psycopg: only where it is used

        return make_postgres_engine(url, timeouts or DbTimeouts())
    engine = create_engine(
        url,
        poolclass=QueuePool if pooled else NullPool,
        connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
        **({"pool_size": 40, "max_overflow": 24} if pooled else {}),  # 40: the thread pool
    )
    writer = _WriterLock(busy_timeout_s)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let us issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cur.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
            return
        writer.acquire(conn.info)
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    @event.listens_for(engine, "handle_error")
    def _on_error(context: Any) -> None:
        if _is_full(context.original_exception) and context.connection is not None:
            context.connection.info[_DISK_FULL] = True

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_conn: Any, record: Any) -> None:
        writer.release(record.info)
        full = record.info.pop(_DISK_FULL, False)
        if full and dbapi_conn is not None:  # rolled back by now (checkin follows reset)
            _empty_wal(dbapi_conn, busy_timeout_s)

    @event.listens_for(engine, "invalidate")
    def _on_invalidate(_dbapi_conn: Any, record: Any, _exc: Any) -> None:
        writer.release(record.info)

    return engine


_DISK_FULL = "disk_full"  # a connection's info: one of its statements found no space left


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


def lock_name(s: Session, name: str) -> None:
    """Hold the lock called `name` until this transaction ends, so that transactions that
    decide on the same thing from different processes do so one after another.
    PostgreSQL: a transaction-level advisory lock on a hash of the name; SQLite: nothing to
    do, its writers already run one at a time (BEGIN IMMEDIATE)."""
    if s.get_bind().dialect.name != "postgresql":
        return
    s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": advisory_key(name)})


def advisory_key(name: str) -> int:
    """PostgreSQL's advisory lock key for the lock called `name`: a hash of the name."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class Database:
    """An engine and the three ways to use it: `writer()` for a transaction that may write
    (committed on success, rolled back on any error), `reader()` for a read-only one, and
    `manual_session()` for the rare caller that commits by hand."""

    def __init__(
        self,
        url: str,
        busy_timeout_s: float = 15.0,
        pooled: bool = False,
        timeouts: DbTimeouts | None = None,
    ) -> None:
        self.local = url.startswith("sqlite")  # a file on this machine, not a server
        self.engine = make_engine(
            url, busy_timeout_s=busy_timeout_s, pooled=pooled, timeouts=timeouts
        )
        self._writers = sessionmaker(self.engine, expire_on_commit=False)
        self._readers = sessionmaker(
            self.engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False
        )

    @classmethod
    def from_settings(cls, settings: Settings, pooled: bool = False) -> Database:
        return cls(
            settings.resolved_database_url,
            busy_timeout_s=settings.db_busy_timeout_s,
            pooled=pooled,
            timeouts=DbTimeouts(
                connect_s=settings.db_connect_timeout_s,
                statement_s=settings.db_statement_timeout_s,
                pool_s=settings.db_pool_timeout_s,
            ),
        )

    @contextmanager
    def writer(self) -> Iterator[Session]:
        """A transaction: committed on success, rolled back on any error."""
        with self._writers.begin() as s:
            yield s

    @contextmanager
    def reader(self) -> Iterator[Session]:
        """A read-only session (on SQLite it never waits for a writer); closed at the end."""
        s = self._readers()
        try:
            yield s
        finally:
            close_quietly(s)

    def snapshot(self) -> Session:
        """A read-only session whose statements all read one snapshot, for a read spread
        over many statements (a model downloaded in chunks); the caller closes it. SQLite's
        read transaction is one already (WAL); PostgreSQL's takes REPEATABLE READ."""
        s = self._readers()
        if not self.local:
            s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        return s

    def manual_session(self) -> Session:
        """A session the caller commits itself; closing it rolls back what was not committed."""
        return self._writers()

    def dispose(self) -> None:
        self.engine.dispose()


def close_quietly(s: Session) -> None:
    """Close `s`, rolling back what it did not commit. A database lost meanwhile fails that
    rollback, which the server does by itself when the connection goes; SQLAlchemy drops the
    connection, and the error is only logged: an API request's session closes after its
    response has started, where raising would break the response."""
    try:
        s.close()
    except DBAPIError as e:
        log.warning("closing a session failed (its connection is dropped): %s", e.orig)

"""Time as the database keeps it: the database's own clock (`db_now`, `db_ago`), which every
liveness judgement compares with, and UTC for the times trainq writes itself.
See docs/operations.md."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import DateTime, Float
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ColumnElement, FunctionElement, literal


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

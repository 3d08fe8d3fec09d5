"""How long trainq waits on PostgreSQL: the bounds an engine is built with (`DbTimeouts`),
and the wider ones a transaction that moves a large value asks for (`allow_time_for`).
Needs no psycopg: core.db.postgres applies them. See docs/operations.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session


@dataclass(frozen=True)
class DbTimeouts:
    """How long trainq waits on PostgreSQL (Settings.db_*_timeout_s; core.db.postgres).
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
    only (core.db.postgres): SQLite has no statement bound."""
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

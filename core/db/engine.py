"""The engine and the ways to use it: `make_engine` for SQLite or PostgreSQL, and
`Database`'s writer, reader and snapshot sessions. See docs/operations.md."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from core.config import Settings
from core.db.bounds import DbTimeouts
from core.db.sqlite import READ_ONLY, make_sqlite_engine

log = logging.getLogger("trainq.db")


def make_engine(
    url: str,
    *,
    busy_timeout_s: float = 15.0,
    pooled: bool = False,
    timeouts: DbTimeouts | None = None,
) -> Engine:
    """SQLite (core.db.sqlite): writers take turns, readers never wait; `pooled` keeps
    connections open between uses (the API). PostgreSQL (core.db.postgres): a pooled engine
    whose every wait on the server is bounded by `timeouts`."""
    if not url.startswith("sqlite"):
        from core.db.postgres import make_postgres_engine  # psycopg: only where it is used

        return make_postgres_engine(url, timeouts or DbTimeouts())
    return make_sqlite_engine(url, busy_timeout_s=busy_timeout_s, pooled=pooled)


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

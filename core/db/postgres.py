"""PostgreSQL engines whose every wait has a bound (core.db.bounds), so that a server that
stops answering costs a request seconds, not forever. See docs/operations.md."""

from __future__ import annotations

import math
from typing import Any

import psycopg
from psycopg.errors import _WaitTimeout
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine

from core.db.bounds import DbTimeouts, statement_bound


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection that waits for its server at most `bound_s` per operation."""

    bound_s: float | None = None
    timeouts: DbTimeouts = DbTimeouts()

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        limit = timeout if timeout is not None else self.bound_s
        try:
            return super().wait(gen, interval=interval, timeout=limit)
        except _WaitTimeout:
            if timeout is not None:
                raise  # psycopg's own bound (a cancel): psycopg handles it
            self.pgconn.finish()  # a reply may still come: this connection can't be reused
            raise psycopg.OperationalError(
                f"the database did not answer within {limit:g} s"
            ) from None


def make_postgres_engine(url: str, timeouts: DbTimeouts) -> Engine:
    connect_args: dict[str, Any] = {
        # libpq counts whole seconds, and takes less than 2 as 2
        "connect_timeout": max(2, math.ceil(timeouts.connect_s)),
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    if timeouts.statement_s is not None:
        connect_args["options"] = f"-c statement_timeout={round(timeouts.statement_s * 1000)}"
        bound = statement_bound(timeouts)
        assert bound is not None
        connect_args["tcp_user_timeout"] = round(bound * 1000)
    engine = create_engine(
        url, pool_pre_ping=True, pool_timeout=timeouts.pool_s, connect_args=connect_args
    )

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        conn = BoundedConnection.connect(*cargs, **cparams)
        conn.timeouts = timeouts
        conn.bound_s = statement_bound(timeouts)
        return conn

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_conn: Any, _record: Any) -> None:
        # The next use is the pool's ping: a live server answers it at once.
        if isinstance(dbapi_conn, BoundedConnection):
            dbapi_conn.bound_s = timeouts.connect_s

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if isinstance(dbapi_conn, BoundedConnection):
            dbapi_conn.bound_s = statement_bound(timeouts)

    return engine

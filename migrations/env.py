"""Alembic environment: the schema of core.db, the URL from trainq's Settings."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from alembic import context
from sqlalchemy import Connection, Engine, text

from core.config import Settings
from core.db import Base, DbTimeouts, advisory_key, make_engine

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    # `trainq migrate` passes the URL it resolved; plain `alembic` falls back to Settings.
    return config.attributes.get("url") or Settings().resolved_database_url


def run_offline() -> None:
    context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


@contextlib.contextmanager
def connected_alone(engine: Engine) -> Iterator[Connection]:
    """A connection to migrate through, one migration run at a time on a database: every
    replica of a deployment may run `trainq migrate` as it starts, and two runs on a fresh
    database would both create the first tables. The others wait, then find the revision
    the first one left. PostgreSQL: a session-level advisory lock, held across the
    migrations' own transaction; SQLite: an exclusive lock on a file beside the database,
    taken before the first connection."""
    if engine.dialect.name == "postgresql":
        key = advisory_key("trainq migrate")
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
            connection.commit()  # the lock is the session's: the migrations begin their own
            try:
                yield connection
            finally:
                connection.rollback()  # a failed migration leaves its transaction aborted
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
                connection.commit()
        return
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        with engine.connect() as connection:
            yield connection
        return
    with Path(f"{database}.migrate-lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        with engine.connect() as connection:
            yield connection


def run_online() -> None:
    engine = make_engine(database_url(), timeouts=DbTimeouts(statement_s=None))
    try:
        with connected_alone(engine) as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=connection.dialect.name == "sqlite",
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:  # a migration that refuses (0006's downgrade) leaves no connection open
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()

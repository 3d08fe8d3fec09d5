"""Alembic environment: the schema of core.db, the URL from trainq's Settings."""

from __future__ import annotations

from alembic import context

from core.config import Settings
from core.db import Base, DbTimeouts, make_engine

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    # `trainq migrate` passes the URL it resolved; plain `alembic` falls back to Settings.
    return config.attributes.get("url") or Settings().resolved_database_url


def run_offline() -> None:
    context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    engine = make_engine(database_url(), timeouts=DbTimeouts(statement_s=None))
    try:
        with engine.connect() as connection:
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

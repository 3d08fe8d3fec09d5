"""Running the Alembic migrations (an explicit step: `trainq migrate`, or `trainq up`).
See docs/operations.md ("Upgrading")."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

import migrations

MIGRATIONS = Path(migrations.__file__).resolve().parent


def alembic_config(url: str) -> Config:
    cfg = Config(str(MIGRATIONS / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url), revision)


def known_revisions() -> set[str]:
    """Every revision this code's migrations name: a database at another one was migrated
    by a newer trainq."""
    return {s.revision for s in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}


def head_revision() -> str:
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None  # the migrations are this package's own
    return head


def database_revision(connection: Connection) -> str | None:
    """The revision the database is at (None: never migrated)."""
    return MigrationContext.configure(connection).get_current_revision()


def schema_problem(url: str) -> str | None:
    """Why the database at `url` is no place for this code's API or workers to start (it is
    not at this code's head: migrate it, or it is newer: upgrade trainq here), or None."""
    from core.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            current = database_revision(conn)
    finally:
        engine.dispose()
    head = head_revision()
    if current == head:
        return None
    if current is not None and current not in known_revisions():
        return (
            f"the database is at revision {current}, newer than this trainq knows ({head}): "
            "upgrade trainq here"
        )
    return f"the database is at revision {current}, not {head}: run `trainq migrate` first"

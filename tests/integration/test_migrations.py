"""The schema changes only through Alembic: head must match the models exactly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from core.db import Base, make_engine
from core.local.migrate import upgrade


def test_migrations_reach_the_models(database_url: str) -> None:
    upgrade(database_url)
    upgrade(database_url)  # idempotent
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
            tables = set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    assert diff == []
    assert {"jobs", "epoch_metrics", "step_metrics", "checkpoints", "artifacts"} <= tables

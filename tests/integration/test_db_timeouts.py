"""PostgreSQL's statement bound (core.db.postgres): a statement past it is stopped by the server,
and a transaction that moves a large value is given time in proportion to its size."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from core.db import SLOWEST_BYTES_PER_S, Database, DbTimeouts, allow_time_for
from tests.service import postgres_database


@pytest.fixture
def db() -> Iterator[Database]:
    for url in postgres_database():
        database = Database(url, timeouts=DbTimeouts(connect_s=2, statement_s=0.5))
        yield database
        database.dispose()


def test_postgres_stops_a_statement_past_its_bound(db: Database) -> None:
    with pytest.raises(OperationalError, match="statement timeout"), db.writer() as s:
        s.execute(text("SELECT pg_sleep(1.5)"))
    with db.writer() as s:  # the connection is usable again
        assert s.scalar(text("SELECT 1")) == 1


def test_postgres_gives_a_transaction_moving_a_large_value_time_for_it(db: Database) -> None:
    with db.writer() as s:
        allow_time_for(s, 2 * SLOWEST_BYTES_PER_S)  # two more seconds
        s.execute(text("SELECT pg_sleep(1.5)"))
    with pytest.raises(OperationalError, match="statement timeout"), db.writer() as s:
        s.execute(text("SELECT pg_sleep(1.5)"))  # the next transaction has the usual bound

"""A network partition between trainq and PostgreSQL: a proxy that stops forwarding but keeps
every socket open, so the server neither answers nor refuses and TCP alone never notices.
The API answers 503 with Retry-After within seconds on every route, and a worker's write
gives up to its retry path instead of hanging."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import Database
from core.schema import upgrade
from tests.service import RedisServer, Service, postgres_database
from tests.wire import WireProxy
from worker.retry import DatabaseAway, retry_write

pytestmark = pytest.mark.slow
TIMEOUTS = {"TRAINQ_DB_CONNECT_TIMEOUT_S": "2", "TRAINQ_DB_STATEMENT_TIMEOUT_S": "3"}
# Far above what the settings above allow (a ping, then a connection attempt), far below
# forever: a request still waiting this long was not bounded.
ANSWER_S = 20.0


@pytest.fixture
def database_url() -> Iterator[str]:
    yield from postgres_database()


@pytest.fixture
def proxy(database_url: str) -> Iterator[WireProxy]:
    url = make_url(database_url)
    wire = WireProxy(url.port or 5432, url.host or "127.0.0.1").start()
    yield wire
    wire.close()


def through(database_url: str, proxy: WireProxy) -> str:
    return make_url(database_url).set(port=proxy.port).render_as_string(hide_password=False)


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path, database_url: str, proxy: WireProxy) -> Iterator[Service]:
    upgrade(database_url)
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    (tmp_path / "data").mkdir()
    os.symlink(data_dir / "mnist-sample", tmp_path / "data" / "mnist-sample")
    service = Service(
        data_dir=tmp_path / "data",
        database_url=through(database_url, proxy),
        redis=redis,
        extra_env=dict(TIMEOUTS),
        log_dir=tmp_path,
    )
    try:
        service.start_api()
        yield service
    finally:
        service.stop()
        redis.kill()


def test_a_partitioned_database_answers_503_with_retry_after_on_every_route(
    svc: Service, proxy: WireProxy
) -> None:
    headers = {"Authorization": f"Bearer {svc.keys[0]}"}
    with httpx.Client(base_url=svc.url, headers=headers, timeout=ANSWER_S) as http:
        assert http.get("/jobs").status_code == 200  # the pool holds live connections now
        proxy.partition()
        # /health last: it may answer from its probe of a second ago (api.routes.health)
        for path in ("/jobs", "/jobs/0f6a1f0e-0000-4000-8000-000000000000", "/health"):
            r = http.get(path)
            assert r.status_code == 503, (path, r.text)
            assert r.headers["Retry-After"], path
        proxy.heal()
        proxy.cut()  # the connections the partition stranded; the pool opens new ones
        assert http.get("/health").status_code == 200
        assert http.get("/jobs").status_code == 200


def test_a_worker_write_through_a_partition_ends_in_its_retry_path(
    tmp_path: Path, database_url: str, proxy: WireProxy
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        database_url=through(database_url, proxy),
        db_connect_timeout_s=1,
        db_statement_timeout_s=2,
    )
    db = Database.from_settings(settings)
    outcome: list[BaseException | int] = []

    def heartbeat(s: Session) -> int:
        return int(s.execute(text("SELECT 1")).scalar_one())

    def write() -> None:
        try:
            outcome.append(retry_write(heartbeat, db, for_s=3, what="a heartbeat"))
        except BaseException as e:
            outcome.append(e)

    try:
        with db.writer() as s:
            s.connection()  # a pooled connection, opened before the partition
        proxy.partition()
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(ANSWER_S)
        assert outcome, "the write neither succeeded nor gave up"
        assert isinstance(outcome[0], DatabaseAway), outcome
    finally:
        proxy.heal()
        db.dispose()

"""A model download holds nothing in the database at its client's pace: a client that reads
the headers and stops leaves SQLite's WAL free to be checkpointed and PostgreSQL with no
transaction open."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.downloads import stalled_download, succeeded_job
from tests.service import RedisServer, Service, postgres_database

pytestmark = pytest.mark.slow
MODEL_BYTES = 32 << 20  # past the sockets' buffers: the stalled response is mid-body


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("downloads")
    if request.param == "postgres":
        urls = postgres_database()
        database_url = next(urls)
    else:
        urls, database_url = iter(()), f"sqlite:///{root / 'trainq.db'}"
    redis = RedisServer(root / "redis")
    redis.start()
    svc = Service(data_dir=root / "data", database_url=database_url, redis=redis, log_dir=root)
    (root / "data").mkdir()
    try:
        svc.migrate()
        svc.start_api()
        yield svc
    finally:
        svc.stop()
        redis.kill()
        next(urls, None)  # drops the PostgreSQL database


def open_transactions(database_url: str) -> int:
    """SQLite: 1 if a reader keeps the WAL from being checkpointed whole, else 0.
    PostgreSQL: the other connections in a transaction (idle in it, or reading)."""
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            conn.execute("PRAGMA busy_timeout=200")
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return int(busy)
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return int(
                conn.scalar(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND xact_start IS NOT NULL "
                        "AND pid <> pg_backend_pid()"
                    )
                )
            )
    finally:
        engine.dispose()


def test_a_stalled_download_holds_no_transaction(service: Service) -> None:
    alice = service.keys[0]
    mine = succeeded_job(service.database_url, alice, MODEL_BYTES)
    sock = stalled_download(service.port, alice, mine)
    try:
        succeeded_job(service.database_url, alice, 1000)  # a write after the download began
        assert open_transactions(service.database_url) == 0
    finally:
        sock.close()


def test_a_download_with_no_room_to_stage_its_copy_answers_503(service: Service) -> None:
    alice = service.keys[0]
    mine = succeeded_job(service.database_url, alice, 1000)
    staging = service.data_dir / "downloads"
    shutil.rmtree(staging, ignore_errors=True)
    staging.write_bytes(b"")  # a file where the folder should be: no copy can be made
    try:
        r = httpx.get(
            f"{service.url}/jobs/{mine}/model", headers={"Authorization": f"Bearer {alice}"}
        )
    finally:
        staging.unlink()
    assert r.status_code == 503, r.text[:200]
    assert r.headers["Retry-After"]

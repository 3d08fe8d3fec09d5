"""/health under a stalled database or Redis: a proxy that stops forwarding but keeps every
socket open, so the server neither answers nor refuses. /health still answers within the
time an orchestrator's probe waits, 503 naming what is away, and 200 once it is back."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from core.schema import upgrade
from tests.service import RedisServer, Service, fresh_service, postgres_database, wait_until
from tests.wire import WireProxy

pytestmark = pytest.mark.slow
# What an orchestrator's probe waits, with room: a /health that has not answered by then
# waited on the stalled server.
PROBE_TIMEOUT_S = 2.5
HEALTH_FRESH_S = 1.0  # how long an API process keeps its last probe (HealthCache)


def probe(svc: Service) -> httpx.Response:
    time.sleep(HEALTH_FRESH_S + 0.2)  # past the last probe: this one asks again
    return httpx.get(f"{svc.url}/health", timeout=PROBE_TIMEOUT_S)


def healthy(svc: Service) -> bool:
    try:
        return httpx.get(f"{svc.url}/health", timeout=PROBE_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def pg_svc(tmp_path: Path, data_dir: Path) -> Iterator[tuple[Service, WireProxy]]:
    """The API on PostgreSQL through a proxy, with the database's default timeouts."""
    for database_url in postgres_database():
        upgrade(database_url)
        url = make_url(database_url)
        proxy = WireProxy(url.port or 5432, url.host or "127.0.0.1").start()
        redis = RedisServer(tmp_path / "redis")
        redis.start()
        (tmp_path / "data").mkdir()
        os.symlink(data_dir / "mnist-sample", tmp_path / "data" / "mnist-sample")
        service = Service(
            data_dir=tmp_path / "data",
            database_url=url.set(port=proxy.port).render_as_string(hide_password=False),
            redis=redis,
            log_dir=tmp_path,
        )
        try:
            service.start_api()
            yield service, proxy
        finally:
            service.stop()
            redis.kill()
            proxy.close()


def test_a_stalled_database_is_reported_within_a_probe_timeout(
    pg_svc: tuple[Service, WireProxy],
) -> None:
    svc, proxy = pg_svc
    assert probe(svc).status_code == 200  # the pool holds live connections now
    proxy.partition()
    for _ in range(2):  # the second while the first probe's wait is still stuck
        r = probe(svc)
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"]
        body = r.json()
        assert (body["database"], body["redis"]) == (False, True), body
        assert "database" in body["database_problem"], body
    proxy.heal()
    proxy.cut()  # the connections the partition stranded; the pool opens new ones
    wait_until(lambda: healthy(svc), 60, "/health to answer 200 again", 0.5)


@pytest.fixture
def redis_svc(tmp_path: Path) -> Iterator[tuple[Service, WireProxy]]:
    """The API on a SQLite file, its Redis through a proxy."""
    with fresh_service(tmp_path, None, api=False) as svc:
        proxy = WireProxy(svc.redis.port).start()
        svc.extra_env = {"TRAINQ_REDIS_URL": proxy.url}
        svc.migrate()
        svc.start_api()
        try:
            yield svc, proxy
        finally:
            proxy.close()


def test_a_stalled_redis_is_reported_within_a_probe_timeout(
    redis_svc: tuple[Service, WireProxy],
) -> None:
    svc, proxy = redis_svc
    assert probe(svc).status_code == 200
    proxy.partition()
    for _ in range(2):
        r = probe(svc)
        assert r.status_code == 503, r.text
        body = r.json()
        assert (body["database"], body["redis"]) == (True, False), body
        assert "Redis" in body["redis_problem"], body
    proxy.heal()
    proxy.cut()
    wait_until(lambda: healthy(svc), 60, "/health to answer 200 again", 0.5)

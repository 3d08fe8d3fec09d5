from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.db import Database
from tests.db import migrated
from tests.service import RedisServer, Service, postgres_database

# Pairs of API keys the shared service accepts: one pair a module (or topic) that uses it.
TENANTS = 24


@contextlib.contextmanager
def database(kind: str, folder: Path) -> Iterator[str]:
    """A fresh database: a SQLite file in `folder`, or a PostgreSQL database dropped
    afterwards (skipped where none is reachable, as postgres_database says)."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'trainq.db'}"
    else:
        yield from postgres_database()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with database(request.param, tmp_path_factory.mktemp("db")) as url:
        yield url


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[Database]:
    """The module's database, at head."""
    with migrated(database_url) as database:
        yield database


@pytest.fixture(scope="module")
def service_data_dir(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    folder = tmp_path_factory.mktemp("svc")
    shutil.copytree(data_dir / "mnist-sample", folder / "mnist-sample")
    return folder


def tenants_of(service: Service) -> Iterator[Service]:
    for keys in zip(service.tenant_keys[::2], service.tenant_keys[1::2], strict=True):
        yield service.as_tenant(keys)
    raise AssertionError(f"more than {TENANTS} modules share the service: raise TENANTS")


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def tenants(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, data_dir: Path
) -> Iterator[Iterator[Service]]:
    """One service for the whole session (a redis-server, a database, the API and one CPU
    worker), handed to each module that needs only *a* running service as a tenant of its
    own: a pair of keys no other module has, so that none sees another's jobs or data sets.
    Modules that kill, partition or reconfigure a service start their own."""
    root = tmp_path_factory.mktemp(f"shared-{request.param}")
    shutil.copytree(data_dir / "mnist-sample", root / "data" / "mnist-sample")
    with database(request.param, root) as url:
        redis = RedisServer(root / "redis")
        redis.start()
        shared = Service(
            data_dir=root / "data",
            database_url=url,
            redis=redis,
            log_dir=root,
            tenant_keys=tuple(f"key-tenant{i // 2}-{'ab'[i % 2]}" for i in range(2 * TENANTS)),
            # One upload parsed at a time, so that test_uploads_past_the_limit_are_429 can
            # fill it; no other test uploads while it runs.
            extra_env={"TRAINQ_MAX_PARALLEL_UPLOADS": "1"},
        )
        try:
            yield tenants_of(shared.up(workers=1))
        finally:
            shared.stop()
            redis.kill()


@pytest.fixture(scope="module")
def service(tenants: Iterator[Service]) -> Iterator[Service]:
    """The shared service, through this module's own pair of keys."""
    tenant = next(tenants)
    yield tenant
    tenant.cancel_unfinished()


@pytest.fixture(scope="module")
def own_service(
    service_data_dir: Path, database_url: str, redis_server: RedisServer
) -> Iterator[Service]:
    """A service of the module's own, for tests that would disturb a shared one."""
    svc = Service(data_dir=service_data_dir, database_url=database_url, redis=redis_server)
    yield svc.up(workers=1)
    svc.stop()

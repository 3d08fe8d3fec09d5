from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.db import Database
from core.local.migrate import upgrade
from tests.service import RedisServer, Service, postgres_database


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
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'trainq.db'}"
    else:
        yield from postgres_database()


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[Database]:
    """The database at `database_url`, migrated to head."""
    upgrade(database_url)
    database = Database(database_url)
    yield database
    database.dispose()


@pytest.fixture(scope="module")
def service_data_dir(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    folder = tmp_path_factory.mktemp("svc")
    shutil.copytree(data_dir / "mnist-sample", folder / "mnist-sample")
    return folder


@pytest.fixture(scope="module")
def service(
    service_data_dir: Path, database_url: str, redis_server: RedisServer
) -> Iterator[Service]:
    svc = Service(data_dir=service_data_dir, database_url=database_url, redis=redis_server)
    yield svc.up(workers=1)
    svc.stop()

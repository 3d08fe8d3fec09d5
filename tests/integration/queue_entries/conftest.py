"""One service with one worker for each module here: a worker that meets the entries a
producer with write access to Redis can make."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from tests.service import RedisServer, Service


@pytest.fixture(scope="module")
def svc(
    service_data_dir: Path, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("db") / "trainq.db"
    service = Service(data_dir=service_data_dir, database_url=f"sqlite:///{db}", redis=redis_server)
    yield service.up(workers=1)
    service.stop()


@pytest.fixture
def r(svc: Service) -> Iterator[Redis]:
    client = svc.redis.client()
    yield client
    client.close()

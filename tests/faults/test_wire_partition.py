"""A network partition between a worker and Redis: the peer neither answers nor refuses, so
only a socket timeout notices. The worker trains through it, its heartbeat and progress keep
reaching the database, and the job succeeds once the link heals."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.db import Database, as_utc
from core.store import get_job
from tests.service import Service, fresh_service, wait_until
from tests.wire import WireProxy

SPEC = {"epochs": 5, "batch_size": 128, "seed": 3}  # 32 steps an epoch, seconds an epoch here
STEPS = 5 * 32
PARTITION_S = 12.0


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    with fresh_service(tmp_path, data_dir, None, api=False) as service:
        yield service


def beat(db: Database, job_id: str) -> tuple[dt.datetime | None, str]:
    """The job row's heartbeat (written from the training loop) and status."""
    with db.writer() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None
        return as_utc(job.heartbeat_at), str(job.status)


def test_a_partitioned_worker_keeps_training_and_its_job_succeeds(svc: Service) -> None:
    proxy = WireProxy(svc.redis.port).start()
    svc.migrate()
    svc.start_api()  # straight to Redis
    svc.extra_env = {"TRAINQ_REDIS_URL": proxy.url}  # the worker, through the wire
    svc.start_worker()
    svc.wait_for_workers(1)
    c = svc.client()
    job_id = str(c.submit(SPEC)["id"])
    db = Database(svc.database_url)
    try:
        wait_until(lambda: beat(db, job_id)[0] is not None, 60, "the job's first heartbeat", 0.1)
        proxy.partition()
        cut_at = dt.datetime.now(dt.UTC)
        seen: list[tuple[dt.datetime | None, str]] = []
        deadline = time.monotonic() + PARTITION_S
        while time.monotonic() < deadline:
            seen.append(beat(db, job_id))
            time.sleep(0.25)
        proxy.heal()
        # Written by the training loop while its Redis was unreachable, well after the cut:
        # the loop was not stuck in a Redis call.
        late = cut_at + dt.timedelta(seconds=3)
        assert any(t is not None and t > late for t, _ in seen), f"no heartbeat: {seen[-1]}"
        assert seen[-1][1] == "running"
        wait_until(lambda: c.job(job_id)["status"] == "succeeded", 120, "the job to succeed", 0.5)
        job = c.job(job_id)
        assert job["attempt"] == 1
        steps = [p["step"] for p in c.metrics(job_id, limit=1000)["items"]]
        assert steps == list(range(1, STEPS + 1))
    finally:
        db.dispose()
        proxy.close()

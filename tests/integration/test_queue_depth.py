"""The queue depth /health and /metrics report counts the entries a worker will run: not
those of jobs canceled after they were queued, which stay on the queue until a worker takes
and skips them, nor those naming no job."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.queue import enqueue_job, job_queue
from core.spec import JobSpec
from tests.service import Service, fresh_service

HEALTH_FRESH_S = 1.0  # how long an API process keeps its last probe (HealthCache)


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    with fresh_service(tmp_path, None) as service:  # no worker: every entry stays queued
        yield service


def reported_depths(svc: Service) -> tuple[int, float]:
    """The depth /health and /metrics report, read past any probe made before."""
    time.sleep(HEALTH_FRESH_S + 0.5)
    health = httpx.get(f"{svc.url}/health")
    assert health.status_code == 200, health.text
    metrics = httpx.get(f"{svc.url}/metrics", headers={"Authorization": f"Bearer {svc.admin_key}"})
    assert metrics.status_code == 200, metrics.text
    line = next(x for x in metrics.text.splitlines() if x.startswith("trainq_queue_depth "))
    return health.json()["queue_depth"], float(line.split()[1])


def test_canceled_jobs_and_junk_on_the_queue_are_not_counted_as_waiting(svc: Service) -> None:
    c = svc.client()
    jobs = [str(c.submit({"epochs": 1})["id"]) for _ in range(5)]
    for job_id in jobs[:3]:
        assert c.cancel(job_id)["status"] == "canceled"
    with svc.redis.client() as r:
        # A direct entry (its row is written by the worker that admits it) will run too.
        direct = str(uuid.uuid4())
        spec = JobSpec().model_dump()
        enqueue_job(r, queue=svc.queue, job_id=direct, spec=spec, owner=None, timeout_s=60)
        queue = job_queue(r, svc.queue)
        r.rpush(queue.key, b"not-a-job")
        listed = queue.count
    assert listed == 7  # every entry is still on the queue
    assert reported_depths(svc) == (3, 3.0)

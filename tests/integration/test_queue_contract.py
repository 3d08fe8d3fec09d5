"""Other services enqueue straight onto the RQ queue, importing only redis and rq."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import pytest

from tests.service import Service, status_of, wait_until

DIRECT = """
import json, sys
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

url, queue, job_id, spec = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
r = Redis.from_url(url)
Queue(queue, connection=r, serializer=JSONSerializer).enqueue(
    "worker.tasks.train", spec=spec, job_id=job_id
)
assert not [m for m in sys.modules if m.split(".")[0] in ("core", "api", "worker", "torch")]
"""


def run_directly(service: Service, spec: str, until: str) -> dict[str, Any]:
    """A job of `spec` (JSON) enqueued by a process that imports only redis and rq, as an
    admin sees it once it is `until`."""
    job_id = str(uuid.uuid4())
    subprocess.run(
        [sys.executable, "-I", "-c", DIRECT, service.redis.url, service.queue, job_id, spec],
        check=True,
        cwd="/",  # nothing of trainq's on the path
    )
    admin = service.client(service.admin_key)
    wait_until(lambda: status_of(admin, job_id) == until, 60, "the job", interval=0.2)
    return admin.job(job_id)


@pytest.mark.slow  # several seconds of training: the full run, not --fast
def test_a_job_enqueued_with_only_redis_and_rq_runs_and_is_visible(service: Service) -> None:
    job = run_directly(service, '{"epochs": 1, "max_steps": 5}', "succeeded")
    assert job["spec"]["max_steps"] == 5 and job["attempt"] == 1
    admin = service.client(service.admin_key)
    assert [p["step"] for p in admin.metrics(job["id"])["items"]] == [1, 2, 3, 4, 5]
    # Jobs without an owner belong to the admins, not to other keys.
    assert job["id"] not in [j["id"] for j in service.client().jobs()]


def test_an_invalid_spec_on_the_queue_fails_the_job_clearly(service: Service) -> None:
    job = run_directly(service, '{"epochs": 0, "lr": "fast"}', "failed")
    assert job["error"]["code"] == "invalid_spec"
    assert "epochs" in job["error"]["message"] and "lr" in job["error"]["message"]
    assert job["spec"] == {"as_sent": {"epochs": 0, "lr": "fast"}}

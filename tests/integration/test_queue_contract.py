"""Other services enqueue straight onto the RQ queue, importing only redis and rq."""

from __future__ import annotations

import subprocess
import sys
import uuid

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


def enqueue_directly(service: Service, job_id: str, spec: str) -> None:
    subprocess.run(
        [sys.executable, "-I", "-c", DIRECT, service.redis.url, service.queue, job_id, spec],
        check=True,
        cwd="/",  # nothing of trainq's on the path
    )


def test_a_job_enqueued_with_only_redis_and_rq_runs_and_is_visible(service: Service) -> None:
    job_id = str(uuid.uuid4())
    enqueue_directly(service, job_id, '{"epochs": 1, "max_steps": 5}')
    admin = service.client(service.admin_key)
    wait_until(lambda: status_of(admin, job_id) == "succeeded", 60, "the job", interval=0.2)
    job = admin.job(job_id)
    assert job["spec"]["max_steps"] == 5 and job["attempt"] == 1
    assert [p["step"] for p in admin.metrics(job_id)["items"]] == [1, 2, 3, 4, 5]
    # Jobs without an owner belong to the admins, not to other keys.
    assert job_id not in [j["id"] for j in service.client().jobs()]


def test_an_invalid_spec_on_the_queue_fails_the_job_clearly(service: Service) -> None:
    job_id = str(uuid.uuid4())
    enqueue_directly(service, job_id, '{"epochs": 0, "lr": "fast"}')
    admin = service.client(service.admin_key)
    wait_until(lambda: status_of(admin, job_id) == "failed", 60, "the job", interval=0.2)
    job = admin.job(job_id)
    assert job["error"]["code"] == "invalid_spec"
    assert "epochs" in job["error"]["message"] and "lr" in job["error"]["message"]
    assert job["spec"] == {"as_sent": {"epochs": 0, "lr": "fast"}}

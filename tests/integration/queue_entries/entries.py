"""Queue entries as these tests write them and wait for their end."""

from __future__ import annotations

import pytest
from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from client.http import ApiError
from tests.service import Service, wait_until

TASK = "worker.tasks.train"
SPEC = {"epochs": 1, "max_steps": 3}
ENDED = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)


def rq_queue(svc: Service, r: Redis) -> Queue:
    return Queue(svc.queue, connection=r, serializer=JSONSerializer)


def ended(r: Redis, entry: str) -> Job:
    job = Job.fetch(entry, connection=r, serializer=JSONSerializer)
    wait_until(lambda: job.get_status() in ENDED, 30, f"queue entry {entry} to end", 0.1)
    return job


def assert_refused(
    svc: Service, r: Redis, entry: str, reason: str, job_id: str | None = None
) -> None:
    job = ended(r, entry)
    assert job.get_status() == JobStatus.FAILED
    assert entry in FailedJobRegistry(svc.queue, connection=r, serializer=JSONSerializer)
    result = job.latest_result()
    assert result is not None and result.exc_string is not None
    assert result.exc_string.startswith("refused by trainq: ") and reason in result.exc_string
    # Nothing of it ran: no trainq job was made for it.
    with pytest.raises(ApiError) as e:
        svc.client(svc.admin_key).job(job_id or entry)
    assert e.value.status == 404

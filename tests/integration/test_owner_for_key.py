"""A producer that enqueues straight onto the queue gives the job to an API key's owner with
`client.owner_for_key`: that key then sees the job over HTTP, and another key does not."""

from __future__ import annotations

import uuid

import pytest

from client import owner_for_key
from core.queue import enqueue_job
from tests.service import Service, status_of, wait_until


@pytest.mark.slow  # a job trained end to end: the full run, not --fast
def test_a_job_enqueued_for_a_keys_owner_is_that_keys(service: Service) -> None:
    alice, bob = service.keys
    job_id = str(uuid.uuid4())
    with service.redis.client() as r:
        enqueue_job(
            r,
            queue=service.queue,
            job_id=job_id,
            spec={"epochs": 1, "max_steps": 3},
            owner=owner_for_key(alice),
            timeout_s=600,
        )
    mine = service.client(alice)
    wait_until(lambda: status_of(mine, job_id) == "succeeded", 60, "the job", interval=0.2)
    assert job_id in [j["id"] for j in mine.jobs()]
    assert status_of(service.client(bob), job_id) is None  # another owner's: 404

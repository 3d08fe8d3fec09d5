"""kmnist is offered no longer (no registry here ships it): a new spec naming it is a 422 on
`dataset`, while jobs stored under it still read everywhere, and one still queued ends failed
with the reason instead of running."""

from __future__ import annotations

import uuid

import pytest
from redis import Redis

from api.auth import owner_id
from client.http import ApiError
from core.db import Database
from core.queue import enqueue_job
from core.store import create_job
from tests.service import Service, status_of, wait_until

STORED_SPEC = {"dataset": "kmnist", "epochs": 1, "max_steps": 3}  # as an older trainq kept it


def stored_job(service: Service) -> str:
    """A queued job whose spec names kmnist, written as the database holds specs: plain
    JSON, never validated again on the way out."""
    job_id = str(uuid.uuid4())
    db = Database(service.database_url)
    try:
        with db.writer() as s:
            create_job(s, job_id=job_id, spec=STORED_SPEC, owner=owner_id(service.keys[0]))
    finally:
        db.dispose()
    return job_id


def test_a_new_job_on_kmnist_is_422_naming_the_field(service: Service) -> None:
    with pytest.raises(ApiError) as exc:
        service.client().submit({"dataset": "kmnist"})
    assert exc.value.status == 422
    [problem] = exc.value.detail
    assert problem["loc"] == ["body", "dataset"]
    assert "'kmnist' is no longer offered" in problem["msg"]


def test_a_stored_kmnist_job_still_reads(service: Service) -> None:
    job_id = stored_job(service)
    c = service.client()
    assert c.job(job_id)["spec"] == STORED_SPEC
    assert job_id in {job["id"] for job in c.jobs()}
    assert job_id in {job["id"] for job in c.jobs(status="queued")}


def test_a_queued_kmnist_job_ends_failed_saying_why(service: Service) -> None:
    job_id = stored_job(service)
    with Redis.from_url(service.redis.url) as r:
        enqueue_job(
            r,
            queue=service.queue,
            job_id=job_id,
            spec=STORED_SPEC,
            owner=owner_id(service.keys[0]),
            timeout_s=600,
        )
    c = service.client()
    wait_until(lambda: status_of(c, job_id) == "failed", 60, f"job {job_id} to fail")
    error = c.job(job_id)["error"]
    assert error["code"] == "invalid_spec"
    assert "'kmnist' is no longer offered" in error["message"]

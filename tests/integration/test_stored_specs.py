"""A job's row holds its spec as submitted. A row written before a recipe field existed
(augment, ema_decay, conv3_channels) trains the recipe it was submitted with, not today's
defaults: a resumed checkpoint of the two-block model still loads, and nobody's job changes
under them across an upgrade. A spec sent straight to the queue takes today's defaults."""

from __future__ import annotations

import uuid

import pytest
from redis import Redis

from api.auth import owner_id
from core.db import Database
from core.queue import enqueue_job
from core.spec import BEFORE_FIELD, JobSpec
from core.store import create_job
from tests.service import Service, status_of, wait_until

# As a trainq before these fields stored it: every other field of its day, none of these.
OLD_ROW = {
    k: v
    for k, v in JobSpec(epochs=1, max_steps=3, export=["torchscript"])
    .model_dump(mode="json")
    .items()
    if k not in BEFORE_FIELD
}


def run_to_the_end(service: Service, spec: dict[str, object], *, row: bool) -> dict:
    job_id = str(uuid.uuid4())
    owner = owner_id(service.keys[0])
    if row:
        db = Database(service.database_url)
        try:
            with db.writer() as s:
                create_job(s, job_id=job_id, spec=spec, owner=owner)
        finally:
            db.dispose()
    with Redis.from_url(service.redis.url) as r:
        enqueue_job(r, queue=service.queue, job_id=job_id, spec=spec, owner=owner, timeout_s=600)
    c = service.client()
    wait_until(lambda: status_of(c, job_id) == "succeeded", 120, f"job {job_id} to succeed")
    return c.record(job_id)["spec"]


def test_a_row_from_before_the_recipe_fields_trains_its_old_recipe(service: Service) -> None:
    trained = run_to_the_end(service, OLD_ROW, row=True)
    assert trained["conv3_channels"] == 0
    assert trained["augment"] == "none"
    assert trained["ema_decay"] is None


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_a_spec_sent_straight_to_the_queue_takes_todays_defaults(service: Service) -> None:
    trained = run_to_the_end(service, {"epochs": 1, "max_steps": 3}, row=False)
    today = JobSpec()
    assert trained["conv3_channels"] == today.conv3_channels
    assert trained["augment"] == today.augment
    assert trained["ema_decay"] == today.ema_decay

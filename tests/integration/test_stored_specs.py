"""A job's row holds its spec as submitted. A row written before a recipe field existed
(augment, ema_decay, conv3_channels) trains the recipe it was submitted with, not today's
defaults: a resumed checkpoint of the two-block model still loads, and nobody's job changes
under them across an upgrade. A spec sent straight to the queue takes today's defaults."""

from __future__ import annotations

import uuid

import httpx
import pytest
from redis import Redis

from api.auth import owner_id
from core.db import Database
from core.queue import enqueue_job
from core.recipes import KNOBS
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


def test_a_recipe_fills_what_the_job_leaves_out_and_its_record_says_so(service: Service) -> None:
    c = service.client()
    job = c.submit({"recipe": "fast", "lr": 0.005, "max_steps": 3, "export": ["torchscript"]})
    assert job["spec"]["recipe"] == "fast" and job["spec"]["batch_size"] == 256
    assert job["spec"]["lr"] == 0.005  # given: kept, and not the recipe's
    assert set(job["spec"]["recipe_filled"]) == set(KNOBS) - {"lr"}
    wait_until(lambda: status_of(c, job["id"]) == "succeeded", 120, "the fast job")
    trained = c.record(job["id"])["spec"]
    assert (trained["recipe"], trained["epochs"], trained["ema_decay"]) == ("fast", 1, None)
    assert trained["recipe_filled"] == job["spec"]["recipe_filled"]


def test_a_spec_that_says_its_recipe_filled_what_it_did_not_is_a_422(service: Service) -> None:
    forged = {"recipe": "fast", "batch_size": 32, "recipe_filled": ["batch_size"]}
    resp = httpx.post(
        f"{service.url}/jobs",
        json=forged,
        headers={"Authorization": f"Bearer {service.keys[0]}"},
    )
    assert resp.status_code == 422, resp.text
    assert "batch_size is not the fast recipe's 256" in resp.text

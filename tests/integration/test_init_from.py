"""init_from through the running service: a job starts from the caller's own succeeded job
only; another key's job reads exactly as a missing one; another architecture, or a source
deleted since, is a 422 that says why; ImageNet weights (pretrained) are for
efficientnet_lite0 alone, and its record names them."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from core.train.pretrained import WEIGHTS_FILE, WEIGHTS_SHA256
from tests.integration.test_queue_contract import run_directly
from tests.service import Service, trained

SMALL = {
    "epochs": 1, "max_steps": 3, "batch_size": 64, "min_lr": 0, "ema_decay": None,
    "augment": "none", "export": ["torchscript"],
}  # fmt: skip


def post(service: Service, key: str, spec: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{service.url}/jobs", headers=headers, json=spec, timeout=30)


@pytest.fixture(scope="module")
def source(service: Service) -> str:
    return str(trained(service.client(service.keys[0]), SMALL)["id"])


def test_another_keys_job_reads_exactly_as_a_missing_one(service: Service, source: str) -> None:
    other = str(uuid.uuid4())
    theirs = post(service, service.keys[1], {**SMALL, "init_from": source})
    missing = post(service, service.keys[1], {**SMALL, "init_from": other})
    assert theirs.status_code == missing.status_code == 422, theirs.text
    (a,), (b,) = theirs.json()["detail"], missing.json()["detail"]
    assert a["loc"] == ["body", "init_from"] and a["type"] == "init_from"
    assert a["msg"].replace(source, "ID") == b["msg"].replace(other, "ID")


def test_a_job_of_another_architecture_is_refused(service: Service, source: str) -> None:
    r = post(service, service.keys[0], {**SMALL, "model": "resnet18", "init_from": source})
    assert r.status_code == 422, r.text
    assert "trained a cnn" in r.json()["detail"][0]["msg"]


def test_a_job_starts_from_ones_own_model_then_not_once_it_is_deleted(
    service: Service, source: str
) -> None:
    c = service.client(service.keys[0])
    spec = {**SMALL, "init_from": source, "freeze_backbone": True}
    tuned = trained(c, spec)
    assert tuned["spec"]["init_from"] == source
    c.delete(tuned["id"])
    r = post(service, service.keys[0], {**SMALL, "init_from": tuned["id"]})
    assert r.status_code == 422 and "no succeeded job" in r.json()["detail"][0]["msg"], r.text


def test_a_sweep_starts_only_from_ones_own_job(service: Service, source: str) -> None:
    body = {"base": {**SMALL, "init_from": source}, "space": {"lr": {"choice": [1e-3, 2e-3]}}}
    headers = {"Authorization": f"Bearer {service.keys[1]}"}
    r = httpx.post(f"{service.url}/sweeps", headers=headers, json=body, timeout=30)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "base", "init_from"]


def test_the_worker_checks_the_start_again(service: Service, source: str) -> None:
    """Straight onto the queue (no API check): a job without an owner names another's job,
    as it would one deleted since its submission. It fails, saying why."""
    job = run_directly(service, json.dumps({**SMALL, "init_from": source}), "failed")
    assert job["error"]["code"] == "invalid_spec"
    assert f"init_from: job {source} has no trained weights" in job["error"]["message"]


def test_pretrained_is_for_lite0_and_not_with_init_from(service: Service, source: str) -> None:
    key = service.keys[0]
    other = post(service, key, {**SMALL, "model": "resnet18", "pretrained": True})
    both = post(service, key, {**SMALL, "model": "efficientnet_lite0", "pretrained": True,
                               "init_from": source})  # fmt: skip
    assert other.status_code == both.status_code == 422, other.text
    assert "offered for efficientnet_lite0, not resnet18" in other.text
    assert "pick one" in both.text


def test_a_pretrained_lite0_job_trains_and_records_its_weights(service: Service) -> None:
    c = service.client(service.keys[0])
    spec = {**SMALL, "model": "efficientnet_lite0", "pretrained": True, "max_steps": 2,
            "batch_size": 16, "backbone_lr_scale": 0.1}  # fmt: skip
    job = trained(c, spec)
    weights = c.record(job["id"])["pretrained_weights"]
    assert weights["sha256"] == WEIGHTS_SHA256 and weights["file"] == WEIGHTS_FILE

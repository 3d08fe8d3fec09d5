"""torchvision's ImageNet weights through the running service: the API refuses a pretrained
job (and a sweep) whose weights file is not installed in its TORCH_HOME, or does not verify,
with a 422 that says how to install it; it accepts one whose file verifies; and the worker
checks its own TORCH_HOME again, failing the job for good, saying why. The API here pins
resnet18 to a file this test makes (tests/pinned_weights_api.py): torchvision's own file
cannot be downloaded here; the worker keeps trainq's own table."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torchvision import models as tv

from tests.service import Service, fresh_service, status_of, wait_until

SPEC = {
    "model": "resnet18",
    "pretrained": True,
    "epochs": 1,
    "max_steps": 2,
    "batch_size": 16,
    "ema_decay": None,
    "augment": "none",
    "export": ["torchscript"],
}  # fmt: skip (the data set: mnist-sample, the default)


def weights() -> tuple[str, bytes]:
    """A randomly initialised ImageNet-shaped resnet18's state dict, and a name that carries
    the first digits of its own sha256 as torchvision's names do."""
    buffer = io.BytesIO()
    torch.save(tv.resnet18(weights=None).state_dict(), buffer)
    data = buffer.getvalue()
    return f"resnet18-{hashlib.sha256(data).hexdigest()[:8]}.pth", data


@pytest.fixture(scope="module")
def made() -> tuple[str, bytes]:
    return weights()


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, made: tuple[str, bytes]
) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("torch-home")
    env = {"TORCH_HOME": str(folder / "torch"), "TEST_RESNET18_WEIGHTS": made[0]}
    with fresh_service(folder, data_dir, env, api=False) as service:
        service.api_module = "tests.pinned_weights_api"
        service.migrate()
        service.start_api()
        yield service


def checkpoints(svc: Service) -> Path:
    return Path(svc.env()["TORCH_HOME"]) / "hub" / "checkpoints"


def post(svc: Service, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {svc.keys[0]}"}
    return httpx.post(f"{svc.url}{path}", headers=headers, json=body, timeout=30)


def test_a_missing_or_replaced_file_is_a_422_saying_how_to_install_it(
    svc: Service, made: tuple[str, bytes]
) -> None:
    expected = checkpoints(svc) / made[0]
    r = post(svc, "/jobs", SPEC)
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]
    assert problem["loc"] == ["body", "pretrained"]
    assert problem["type"] == "pretrained_weights_invalid"
    assert f"{expected} is not there" in problem["msg"]
    assert "torchvision.models.resnet18(weights='IMAGENET1K_V1')" in problem["msg"]
    sweep = post(svc, "/sweeps", {"base": SPEC, "space": {"lr": {"choice": [1e-3, 2e-3]}}})
    assert sweep.status_code == 422, sweep.text
    assert sweep.json()["detail"][0]["loc"] == ["body", "base", "pretrained"]
    expected.parent.mkdir(parents=True)
    expected.write_bytes(made[1][:-1])  # damaged
    r = post(svc, "/jobs", SPEC)
    assert r.status_code == 422 and "does not start with" in r.text, r.text


@pytest.mark.slow
def test_a_verified_file_is_accepted_and_the_worker_checks_its_own_again(
    svc: Service, made: tuple[str, bytes]
) -> None:
    """The API's file verifies; the worker's table (trainq's own) expects torchvision's file,
    which is not there: the job fails at its first attempt, not retried, saying so."""
    checkpoints(svc).mkdir(parents=True, exist_ok=True)
    (checkpoints(svc) / made[0]).write_bytes(made[1])
    r = post(svc, "/jobs", SPEC)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    svc.start_worker()
    c = svc.client(svc.keys[0])
    wait_until(lambda: status_of(c, job_id) == "failed", 120, "the job to fail", interval=0.2)
    job = c.job(job_id)
    assert job["attempt"] == 1 and job["error"]["code"] == "pretrained_weights_invalid"
    expected = checkpoints(svc) / "resnet18-f37072fd.pth"
    assert f"{expected} is not there" in job["error"]["message"]
    assert "hub/checkpoints" in job["error"]["message"]

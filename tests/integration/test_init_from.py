"""init_from through the running service: a job starts from the caller's own succeeded job
only; another key's job reads exactly as a missing one; another architecture, other cnn
widths, images of other channels or size, or a source deleted since, is a 422 that says why,
while other classes are taken; a sweep is refused if any trial it allows could not start;
ImageNet weights (pretrained) are not for the cnn, and a pretrained efficientnet_lite0's
record names them and their preprocessing, and a job started from it keeps that
preprocessing (torchvision's weights: test_torchvision_weights.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.train.data import load_dataset
from core.train.pretrained import MEAN, STD, WEIGHTS_FILE, WEIGHTS_SHA256
from tests.integration.test_queue_contract import run_directly
from tests.service import Service, trained

SMALL = {
    "epochs": 1, "max_steps": 3, "batch_size": 64, "min_lr": 0, "ema_decay": None,
    "augment": "none", "export": ["torchscript"],
}  # fmt: skip


def post(service: Service, key: str, spec: dict[str, Any], route: str = "jobs") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{service.url}/{route}", headers=headers, json=spec, timeout=30)


def refusal(r: httpx.Response) -> str:
    """The one 422's message, on init_from."""
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]
    assert problem["loc"][-1] == "init_from" and problem["type"] == "init_from", problem
    return str(problem["msg"])


def upload(service: Service, path: Path, x: np.ndarray, y: np.ndarray) -> str:
    """An uploaded set of images `x` (N, C, H, W), labels `y`, the first 3/4 to train on."""
    cut = len(y) * 3 // 4
    np.savez(path, x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:])
    return f"ds:{service.client(service.keys[0]).upload_dataset(path)['id']}"


@pytest.fixture(scope="module")
def digits(data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """Real digits 0, 1 and 2 of mnist-sample, 1×28×28, 64 of each."""
    train = load_dataset("mnist-sample", data_dir).train
    keep = np.concatenate([np.flatnonzero(train.labels.numpy() == k)[:64] for k in range(3)])
    return train.images.numpy()[keep], train.labels.numpy()[keep]


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


def test_a_cnn_of_other_widths_is_refused_saying_what_fits(service: Service, source: str) -> None:
    spec = {**SMALL, "init_from": source, "conv1_channels": 16, "hidden": 64}
    msg = refusal(post(service, service.keys[0], spec))
    assert f"job {source} trained a cnn of conv1_channels 32, hidden 128" in msg
    assert msg.endswith("set conv1_channels 32, hidden 128"), msg


@pytest.mark.slow
def test_images_of_other_channels_or_size_are_refused_other_classes_are_not(
    service: Service, source: str, digits: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    """The source trained on mnist-sample's 1×28×28 digits, 10 classes."""
    x, y = digits
    three_classes = upload(service, tmp_path / "three.npz", x, y)
    coloured = upload(service, tmp_path / "rgb.npz", x.repeat(3, axis=1), y)
    padded = F.pad(torch.from_numpy(x), (2, 2, 2, 2)).numpy()  # 1×32×32
    larger = upload(service, tmp_path / "larger.npz", padded, y)
    key = service.keys[0]
    msg = refusal(post(service, key, {**SMALL, "init_from": source, "dataset": coloured}))
    assert "trained on 1-channel images (1×28×28)" in msg and "3-channel ones" in msg
    assert msg.endswith("use a data set of 1-channel images"), msg
    msg = refusal(post(service, key, {**SMALL, "init_from": source, "dataset": larger}))
    assert "fc1 takes 1,152 features" in msg and "1×32×32 images make 2,048" in msg
    assert msg.endswith("use a data set of 1×28×28 images"), msg
    tuned = trained(service.client(key), {**SMALL, "init_from": source, "dataset": three_classes})
    assert tuned["spec"]["init_from"] == source  # a new class layer, for 3 classes


def test_a_sweep_whose_trials_could_not_start_is_refused_naming_them(
    service: Service, source: str
) -> None:
    c = service.client(service.keys[0])
    before = len(list(c.jobs()))
    base = {**SMALL, "init_from": source}
    models = {"base": base, "space": {"model": {"choice": ["cnn", "resnet18"]}}}
    (problem,) = sweep_refusals(post(service, service.keys[0], models, "sweeps"))
    assert problem["msg"] == (
        f"at model='resnet18' the trial cannot start from its init_from: job {source} "
        "trained a cnn: set model 'cnn'"
    )
    grid = {
        "base": base, "sampler": {"name": "grid"}, "trials": 2,
        "space": {"hidden": {"choice": [64, 128, 256]}, "lr": {"choice": [1e-3, 2e-3]}},
    }  # fmt: skip
    named = [p["msg"] for p in sweep_refusals(post(service, service.keys[0], grid, "sweeps"))]
    assert [m.split(" the trial")[0] for m in named] == [
        "at hidden=64, lr=0.001", "at hidden=64, lr=0.002",
        "at hidden=256, lr=0.001", "at hidden=256, lr=0.002",
    ]  # fmt: skip
    assert all(m.endswith("set hidden 128") for m in named), named
    theirs = str(uuid.uuid4())
    starts = {"base": SMALL, "space": {"init_from": {"choice": [source, theirs]}}}
    (problem,) = sweep_refusals(post(service, service.keys[0], starts, "sweeps"))
    assert problem["msg"].startswith(f"at init_from='{theirs}' the trial cannot start")
    assert f"no succeeded job {theirs} of yours" in problem["msg"]
    assert len(list(c.jobs())) == before and not list(c.sweeps())  # nothing made
    fits = {"base": base, "space": {"lr": {"choice": [1e-3, 2e-3]}}, "trials": 1}
    made = c.create_sweep(fits)
    assert c.cancel_sweep(made["id"])["status"] == "canceled"


def sweep_refusals(r: httpx.Response) -> list[dict[str, Any]]:
    """A refused sweep's problems, each on its space and naming a trial's values."""
    assert r.status_code == 422, r.text
    problems: list[dict[str, Any]] = r.json()["detail"]
    assert all(p["loc"] == ["body", "space"] and p["type"] == "init_from" for p in problems)
    return problems


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


def test_pretrained_is_not_for_the_cnn_nor_with_init_from(service: Service, source: str) -> None:
    key = service.keys[0]
    cnn = post(service, key, {**SMALL, "pretrained": True})
    both = post(service, key, {**SMALL, "model": "efficientnet_lite0", "pretrained": True,
                               "init_from": source})  # fmt: skip
    assert cnn.status_code == both.status_code == 422, cnn.text
    assert "efficientnet_lite0, not cnn" in cnn.text
    assert "pick one" in both.text


@pytest.mark.slow
def test_a_pretrained_job_records_its_weights_and_preprocessing_and_a_start_keeps_them(
    service: Service,
) -> None:
    c = service.client(service.keys[0])
    spec = {**SMALL, "model": "efficientnet_lite0", "pretrained": True, "max_steps": 2,
            "batch_size": 16, "backbone_lr_scale": 0.1}  # fmt: skip
    job = trained(c, spec)
    record = c.record(job["id"])
    weights = record["pretrained_weights"]
    assert weights["sha256"] == WEIGHTS_SHA256 and weights["file"] == WEIGHTS_FILE
    pre = record["preprocessing"]  # mnist-sample has one channel: the mean of the three
    assert (pre["mean"], pre["std"]) == ([sum(MEAN) / 3], [sum(STD) / 3])
    assert pre["normalized_by"] == "pretrained weights"
    tuned = trained(c, {**spec, "pretrained": False, "init_from": job["id"]})
    assert c.record(tuned["id"])["preprocessing"] == pre

"""A sweep on an uploaded data set is checked as POST /jobs checks a job: the set must be the
key's own (in the base; the space may not name one, fixed or searched), and every corner of
the space must make a model that fits the set's images. The worker trusts a row's spec, so
POST /sweeps is where this holds."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest

from tests.service import Service


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


@pytest.fixture(scope="module")
def alices_set(service: Service) -> str:
    rng = np.random.default_rng(0)
    blob = npz(
        x_train=rng.integers(0, 255, (64, 1, 28, 28), dtype=np.uint8),
        y_train=rng.integers(0, 10, 64),
        x_test=rng.integers(0, 255, (32, 1, 28, 28), dtype=np.uint8),
        y_test=rng.integers(0, 10, 32),
    )
    r = httpx.post(
        f"{service.url}/datasets",
        headers=auth(service.keys[0]),
        files={"file": ("d.npz", blob, "application/octet-stream")},
        data={"name": "alice's private set"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["dataset"])


SMALL = {"epochs": 1, "min_lr": 0, "ema_decay": None, "augment": "none", "export": ["torchscript"]}


def test_another_keys_data_set_fixed_in_the_space_is_refused(
    service: Service, alices_set: str
) -> None:
    bob = auth(service.keys[1])
    job = httpx.post(f"{service.url}/jobs", headers=bob, json={**SMALL, "dataset": alices_set})
    assert job.status_code == 422  # POST /jobs: another's set reads as missing
    body = {
        "base": SMALL,
        "space": {"dataset": alices_set, "lr": {"choice": [1e-3, 2e-3]}},
        "pruner": {"name": "none"},
        "trials": 1,
        "parallel": 1,
    }
    r = httpx.post(f"{service.url}/sweeps", headers=bob, json=body, timeout=30)
    try:
        assert r.status_code == 422, f"{r.status_code}: bob's trial trains on alice's set"
        assert any("dataset" in str(p) for p in r.json()["detail"]), r.text
    finally:
        if r.status_code == 201:
            httpx.post(f"{service.url}/sweeps/{r.json()['id']}/cancel", headers=bob)


@pytest.mark.parametrize("where", ["space", "base"])
def test_a_model_too_large_for_ones_own_set_is_refused(
    service: Service, alices_set: str, where: str
) -> None:
    """POST /jobs refuses {dataset: ds:<own>, conv2_channels: 1024, hidden: 8192,
    conv3_channels: 0} (411M parameters); a sweep whose space reaches it is queued."""
    alice = auth(service.keys[0])
    wide = {**SMALL, "conv2_channels": 1024, "conv3_channels": 0}
    job = httpx.post(
        f"{service.url}/jobs", headers=alice, json={**wide, "dataset": alices_set, "hidden": 8192}
    )
    assert job.status_code == 422 and "parameters" in job.text
    space: dict[str, object] = {"hidden": {"choice": [16, 8192]}}
    base = dict(wide)
    if where == "space":
        space["dataset"] = alices_set
    else:
        base["dataset"] = alices_set
    body = {"base": base, "space": space, "pruner": {"name": "none"}, "trials": 2, "parallel": 1}
    r = httpx.post(f"{service.url}/sweeps", headers=alice, json=body, timeout=30)
    try:
        assert r.status_code == 422, f"{r.status_code}: a trial POST /jobs refuses is queued"
    finally:
        if r.status_code == 201:
            httpx.post(f"{service.url}/sweeps/{r.json()['id']}/cancel", headers=alice)


def test_another_keys_data_set_in_the_base_reads_as_missing(
    service: Service, alices_set: str
) -> None:
    body = {"base": {**SMALL, "dataset": alices_set}, "space": {"lr": {"choice": [1e-3, 2e-3]}}}
    r = httpx.post(f"{service.url}/sweeps", headers=auth(service.keys[1]), json=body)
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]
    assert problem["loc"] == ["body", "base", "dataset"] and problem["type"] == "dataset_not_found"
    own = httpx.post(
        f"{service.url}/sweeps", headers=auth(service.keys[0]), json={**body, "trials": 1}
    )
    assert own.status_code == 201, own.text  # the owner's own set: a sweep like any job
    httpx.post(f"{service.url}/sweeps/{own.json()['id']}/cancel", headers=auth(service.keys[0]))

"""Sweeps over real HTTP and a real worker (SQLite and PostgreSQL): a small grid whose first
trial leads, so that the pruner stops the two behind it at their first epoch; the sweep
followed live to its end; its trials as ordinary jobs; a sweep of each architecture; the
space checked against JobSpec before anything runs; Idempotency-Key; tenancy; cancel."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from client.http import ApiError
from core.spec import Architecture
from tests.photos import photo_patches
from tests.service import Service
from tests.sweeps import GRID_BASE, GRID_SWEEP

BASE, GRID = GRID_BASE, GRID_SWEEP


def problems(e: pytest.ExceptionInfo[ApiError]) -> list[tuple[Any, ...]]:
    return [tuple(p["loc"]) for p in e.value.detail]


@pytest.mark.slow
def test_a_pruned_sweep_end_to_end(service: Service) -> None:
    c = service.client()
    sweep = c.create_sweep(GRID)
    assert sweep["status"] == "running" and sweep["budget"]["created"] == 1
    seen = list(c.sweep_events(sweep["id"]))
    final = seen[-1]
    assert len(seen) >= 3 and final["status"] == "succeeded", final
    lrs = [t["params"]["lr"] for t in final["trials"]]
    assert lrs[0] == 3e-3 and sorted(lrs[1:]) == [1e-6, 2e-6]  # each grid point once
    assert [t["status"] for t in final["trials"]] == ["succeeded", "pruned", "pruned"]
    for pruned in final["trials"][1:]:
        assert pruned["error"]["code"] == "pruned" and "epoch 1" in pruned["error"]["message"]
        assert len(pruned["values"]) == 1  # it kept its metrics
    assert final["budget"] == {
        "trials": 3, "created": 3, "in_flight": 0, "ended": 3, "pruned": 2, "epochs": 4
    }  # fmt: skip
    best = final["best"]
    assert best["number"] == 0 and best["value"] == final["trials"][0]["value"] > 0.5
    head = httpx.head(f"{service.url}{best['links']['model']}", headers=c.http.headers)
    assert head.status_code == 200
    jobs = list(c.jobs(sweep_id=sweep["id"]))
    assert sorted(j["sweep"]["trial"] for j in jobs) == [0, 1, 2]
    for job in jobs:
        assert job["spec"]["lr"] == job["sweep"]["params"]["lr"]
        assert job["spec"]["epochs"] == 2
    assert {j["status"] for j in c.jobs(status="pruned")} == {"pruned"}
    assert c.epochs(final["trials"][1]["job_id"])[0]["epoch"] == 1


@pytest.fixture(scope="module")
def photos(service: Service, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An uploaded set of 16 real photo patches of 8 px, 4 classes: the name of it."""
    (x_train, y_train), (x_test, y_test) = photo_patches(8, 4), photo_patches(8, 2, seed=1)
    path = tmp_path_factory.mktemp("photos") / "photos.npz"
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return f"ds:{service.client().upload_dataset(path)['id']}"


@pytest.mark.slow  # each model: two trials of two steps, each model checked in a fresh process
@pytest.mark.parametrize("arch", [a for a in Architecture if a is not Architecture.cnn])
def test_a_sweep_of_each_architecture_runs_its_trials(
    service: Service, photos: str, arch: Architecture
) -> None:
    if not service.database_url.startswith("sqlite"):
        pytest.skip("the model is no part of what the database keeps: one database suffices")
    c = service.client()
    base = {
        "dataset": photos, "model": arch, "epochs": 1, "batch_size": 8, "min_lr": 0,
        "export": ["torchscript"],
    }  # fmt: skip
    sweep = c.create_sweep(
        {
            "base": base, "space": {"lr": {"choice": [1e-3, 3e-3]}}, "trials": 2,
            "sampler": {"name": "grid"}, "pruner": {"name": "none"}, "parallel": 1,
        }
    )  # fmt: skip
    final = list(c.sweep_events(sweep["id"]))[-1]
    assert final["status"] == "succeeded", final
    assert [t["status"] for t in final["trials"]] == ["succeeded", "succeeded"]
    assert sorted(t["params"]["lr"] for t in final["trials"]) == [1e-3, 3e-3]
    for trial in final["trials"]:
        job = c.job(trial["job_id"])
        assert job["spec"]["model"] == arch and job["result"]["steps"] == 2


@pytest.mark.parametrize(
    ("space", "loc"),
    [
        ({"lr": {"log_uniform": [1e-4, 20]}}, ("body", "space", "lr", "log_uniform")),
        ({"batch_size": {"choice": [64, 0]}}, ("body", "space", "batch_size", "choice")),
        ({"lr": {"log_uniform": [1e-6, 1e-2]}}, ("body", "space")),  # min_lr above lr
        ({"epochs": {"uniform": [1, 4]}}, ("body", "space")),  # an integer field
        ({"dropout": {"uniform": [0, 0.5]}}, ("body", "space")),  # no such field
        ({"dataset": {"choice": ["mnist", "mnist-sample"]}}, ("body", "space")),
        ({"lr": {"uniform": [1e-3, 1e-2], "choice": [1]}}, ("body", "space", "lr")),
    ],
)
def test_a_space_outside_jobspec_is_refused(
    service: Service, space: dict[str, Any], loc: tuple[str, ...]
) -> None:
    c = service.client()
    before = len(list(c.jobs()))
    with pytest.raises(ApiError) as e:
        c.create_sweep({"space": space})
    assert e.value.status == 422
    assert any(found[: len(loc)] == loc for found in problems(e)), e.value.detail
    assert len(list(c.jobs())) == before  # nothing ran
    assert not [s for s in c.sweeps() if s["spec"]["space"] == space]


def test_idempotency_tenancy_and_cancel(service: Service) -> None:
    c = service.client()
    body = {**GRID, "parallel": 2, "base": {**BASE, "epochs": 50}}
    first = c.create_sweep(body, idempotency_key="sweep-key")
    again = c.create_sweep(body, idempotency_key="sweep-key")
    assert again["id"] == first["id"] and again["budget"]["created"] == 2
    with pytest.raises(ApiError) as conflict:
        c.create_sweep({**body, "trials": 2}, idempotency_key="sweep-key")
    assert conflict.value.status == 409
    other = service.client(service.keys[1])
    for call in (lambda: other.sweep(first["id"]), lambda: other.cancel_sweep(first["id"])):
        with pytest.raises(ApiError) as hidden:
            call()
        assert hidden.value.status == 404
    assert first["id"] not in {s["id"] for s in other.sweeps()}
    # A trial that ended while its sweep runs stays: the search reads it.
    queued = [t for t in c.sweep(first["id"])["trials"] if c.job(t["job_id"])["status"] == "queued"]
    gone = c.cancel(queued[-1]["job_id"])
    assert gone["status"] == "canceled"
    with pytest.raises(ApiError) as kept:
        c.delete(gone["id"])
    assert kept.value.status == 409 and "still runs" in str(kept.value.detail)
    canceled = c.cancel_sweep(first["id"])
    assert canceled["status"] == "canceled"
    with pytest.raises(ApiError) as ended:
        c.cancel_sweep(first["id"])
    assert ended.value.status == 409
    for trial in canceled["trials"]:
        job = c.job(trial["job_id"])
        assert job["status"] in ("canceled", "running")  # a running one stops within steps
    created = c.sweep(first["id"])["budget"]["created"]
    assert created == 3  # the canceled trial's place was taken; none after the cancel
    c.delete(gone["id"])  # the sweep ended: its trials may go

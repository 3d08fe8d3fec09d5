"""Jobs on one data set through real workers: the worker reads the set once and keeps it, the
jobs after the first train on the kept copy (their record says so) with the very results of
a read one, and a placed file that someone changed is placed and read again, never trusted
because a copy was kept. SQLite and PostgreSQL."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.service import Service, trained

SPEC = {"epochs": 1, "batch_size": 32, "ema_decay": None, "export": ["torchscript"], "seed": 3}


def npz(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    np.savez(
        buf,
        x_train=rng.integers(0, 256, (96, 1, 28, 28), dtype=np.uint8),
        y_train=rng.integers(0, 4, 96),
        x_test=rng.integers(0, 256, (32, 1, 28, 28), dtype=np.uint8),
        y_test=rng.integers(0, 4, 32),
    )
    return buf.getvalue()


@pytest.fixture(scope="module")
def uploaded(service: Service) -> dict[str, Any]:
    r = httpx.post(
        f"{service.url}/datasets",
        headers={"Authorization": f"Bearer {service.keys[0]}"},
        files={"file": ("d.npz", npz(0), "application/octet-stream")},
        data={"name": "kept"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def placed(service: Service, ds: dict[str, Any]) -> Path:
    return service.data_dir / "datasets" / "by-id" / f"{ds['id']}.npz"


def test_the_next_job_on_a_set_trains_on_the_kept_copy_alike(
    service: Service, uploaded: dict[str, Any]
) -> None:
    c = service.client()
    spec = {**SPEC, "dataset": uploaded["dataset"]}
    first = trained(c, spec)  # its horse places the file; the worker had nothing to read yet
    second = trained(c, spec)
    assert c.record(first["id"])["data_kept"] is False
    record = c.record(second["id"])
    assert record["data_kept"] is True, service.logs()
    assert record["dataset"]["sha256"] == c.record(first["id"])["dataset"]["sha256"]
    assert second["result"]["test_loss"] == first["result"]["test_loss"]  # bit for bit
    assert record["timings"]["data_s"] < 0.5


@pytest.mark.slow
def test_a_placed_file_changed_behind_the_workers_back_is_placed_and_read_again(
    service: Service, uploaded: dict[str, Any]
) -> None:
    c = service.client()
    spec = {**SPEC, "dataset": uploaded["dataset"]}
    before = trained(c, spec)
    path = placed(service, uploaded)
    good = path.read_bytes()
    path.write_bytes(npz(1))  # another set's bytes where this one's were: not what was kept
    after = trained(c, spec)
    assert path.read_bytes() == good  # the worker placed the stored set again
    assert c.record(after["id"])["data_kept"] is False
    assert c.record(after["id"])["dataset"]["sha256"] == c.record(before["id"])["dataset"]["sha256"]
    assert after["result"]["test_loss"] == before["result"]["test_loss"]

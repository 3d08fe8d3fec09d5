"""Uploaded data sets over real HTTP: upload an RGB set made of real MNIST digits, train a
job on it, predict with its model; tenancy and refusals. SQLite and PostgreSQL."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from core.datasets import MAX_UPLOAD_BYTES
from core.train.data import load_dataset
from tests.service import Service, wait_until

N_TRAIN, N_TEST = 600, 200
TIMEOUT = 120  # the first prediction imports torch into the API process


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def upload(service: Service, blob: bytes, key: str | None = None, **data: str) -> httpx.Response:
    return httpx.post(
        f"{service.url}/datasets",
        headers=auth(key or service.keys[0]),
        files={"file": ("digits.npz", blob, "application/octet-stream")},
        data={"name": "rgb digits", **data},
        timeout=60,
    )


@pytest.fixture(scope="module")
def rgb_digits(data_dir: Path) -> dict[str, np.ndarray]:
    """600 train / 200 test real MNIST digits (a seeded draw: the sample is sorted by
    class), as 3-channel (N, 3, 28, 28) uint8."""
    data = load_dataset("mnist-sample", data_dir)
    g = torch.Generator().manual_seed(0)
    train = torch.randperm(len(data.train.labels), generator=g)[:N_TRAIN]
    test = torch.randperm(len(data.test.labels), generator=g)[:N_TEST]
    return {
        "x_train": data.train.images[train].repeat(1, 3, 1, 1).numpy(),
        "y_train": data.train.labels[train].numpy(),
        "x_test": data.test.images[test].repeat(1, 3, 1, 1).numpy(),
        "y_test": data.test.labels[test].numpy(),
    }


@pytest.fixture(scope="module")
def dataset(service: Service, rgb_digits: dict[str, np.ndarray]) -> dict[str, Any]:
    buf = io.BytesIO()
    d = rgb_digits  # ~1.9 MB as an .npz: over the app's 1 MiB body limit
    np.savez(
        buf, x_train=d["x_train"], y_train=d["y_train"], x_test=d["x_test"], y_test=d["y_test"]
    )
    r = upload(service, buf.getvalue())
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    assert r.headers["location"] == f"/datasets/{out['id']}"
    return out


@pytest.fixture(scope="module")
def job(service: Service, dataset: dict[str, Any]) -> dict[str, Any]:
    c = service.client()
    job = c.submit({"dataset": dataset["dataset"], "epochs": 2, "batch_size": 64})
    status = wait_until(
        lambda: (s := c.job(job["id"])["status"]) in ("succeeded", "failed", "canceled") and s,
        180,
        "the job to train",
        interval=0.2,
    )
    done = c.job(job["id"])
    assert status == "succeeded", done
    return done


def test_upload_describes_the_set(dataset: dict[str, Any]) -> None:
    assert dataset["dataset"] == f"ds:{dataset['id']}"
    assert dataset["image_shape"] == [3, 28, 28]
    assert dataset["num_classes"] == 10
    assert (dataset["train_count"], dataset["test_count"]) == (N_TRAIN, N_TEST)
    assert dataset["name"] == "rgb digits" and len(dataset["sha256"]) == 64


def test_a_job_trains_on_it_and_predicts(
    service: Service,
    dataset: dict[str, Any],
    job: dict[str, Any],
    rgb_digits: dict[str, np.ndarray],
) -> None:
    assert job["spec"]["dataset"] == dataset["dataset"]
    record = service.client().record(job["id"])
    assert record["dataset"]["image_shape"] == [3, 28, 28]
    assert record["dataset"]["name"] == dataset["dataset"]
    assert (record["dataset"]["train_size"], record["dataset"]["test_size"]) == (N_TRAIN, N_TEST)
    assert job["result"]["test_accuracy"] > 0.5
    # The worker placed the canonical file where the trainer reads it.
    placed = service.data_dir / "datasets" / "by-id" / f"{dataset['id']}.npz"
    assert placed.stat().st_size == dataset["size"]

    images = torch.from_numpy(rgb_digits["x_test"][:20]).float() / 255
    labels = torch.from_numpy(rgb_digits["y_test"][:20])
    r = httpx.post(
        f"{service.url}/jobs/{job['id']}/predict",
        headers=auth(service.keys[0]),
        json={"images": images.tolist()},  # C×H×W arrays
        timeout=TIMEOUT,
    )
    assert r.status_code == 200, r.text
    classes = torch.tensor([p["class"] for p in r.json()["predictions"]])
    assert (classes == labels).float().mean().item() >= 0.5
    # RGB PNG files too, and a 1-channel array is refused naming the shape.
    files = []
    for i in range(3):
        buf = io.BytesIO()
        Image.fromarray(rgb_digits["x_test"][i].transpose(1, 2, 0)).save(buf, format="PNG")
        files.append(("files", (f"{i}.png", buf.getvalue(), "image/png")))
    r = httpx.post(
        f"{service.url}/jobs/{job['id']}/predict",
        headers=auth(service.keys[0]),
        files=files,
        timeout=TIMEOUT,
    )
    assert r.status_code == 200, r.text
    assert [p["class"] for p in r.json()["predictions"]] == classes[:3].tolist()
    r = httpx.post(
        f"{service.url}/jobs/{job['id']}/predict",
        headers=auth(service.keys[0]),
        json={"images": [images[0][0].tolist()]},
        timeout=TIMEOUT,
    )
    assert r.status_code == 422 and "3×28×28" in r.text


def test_others_cannot_see_or_use_it(service: Service, dataset: dict[str, Any]) -> None:
    alice, bob, admin = (auth(k) for k in (*service.keys, service.admin_key))
    url = f"{service.url}/datasets"
    assert dataset["id"] in [d["id"] for d in httpx.get(url, headers=alice).json()]
    assert httpx.get(url, headers=bob).json() == []
    assert dataset["id"] in [d["id"] for d in httpx.get(url, headers=admin).json()]
    assert httpx.get(f"{url}/{dataset['id']}", headers=alice).json() == dataset
    r = httpx.get(f"{url}/{dataset['id']}", headers=bob)
    assert r.status_code == 404 and dataset["id"] in r.json()["detail"]
    assert httpx.get(f"{url}/{dataset['id']}", headers=admin).status_code == 200
    assert httpx.get(f"{url}/{dataset['id']}").status_code == 401
    assert httpx.get(f"{url}/not-a-uuid", headers=alice).status_code == 422

    for key, name in [(bob, dataset["dataset"]), (alice, f"ds:{uuid.uuid4()}")]:
        r = httpx.post(f"{service.url}/jobs", headers=key, json={"dataset": name, "epochs": 1})
        assert r.status_code == 422, r.text
        (problem,) = r.json()["detail"]
        assert problem["loc"] == ["body", "dataset"] and "POST /datasets" in problem["msg"]
    r = httpx.post(f"{service.url}/jobs", headers=alice, json={"dataset": "ds:nope"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "dataset"]
    # Bob's refused submits left no job behind.
    assert list(service.client(service.keys[1]).jobs()) == []


def test_bad_uploads_are_refused_naming_the_problem(service: Service) -> None:
    pickled = io.BytesIO()
    x = np.empty(4, dtype=object)
    np.savez(pickled, x_train=x, y_train=np.arange(4), x_test=x, y_test=np.arange(4))
    for blob, words in [(pickled.getvalue(), "pickled"), (b"plain text", "not an .npz or .zip")]:
        r = upload(service, blob)
        assert r.status_code == 422, r.text
        (problem,) = r.json()["detail"]
        assert problem["loc"] == ["body", "file"] and words in problem["msg"]
    r = httpx.post(
        f"{service.url}/datasets",
        headers=auth(service.keys[0]),
        files={"file": ("x.npz", b"x")},
        timeout=30,
    )
    assert r.status_code == 422 and ["body", "name"] in [e["loc"] for e in r.json()["detail"]]


def test_an_upload_over_200_mib_is_413(service: Service) -> None:
    def body() -> Iterator[bytes]:  # chunked: no Content-Length to check up front
        boundary = b"--b\r\n"
        yield boundary + b'Content-Disposition: form-data; name="file"; filename="x.npz"\r\n\r\n'
        chunk = b"\0" * (1 << 20)
        for _ in range(MAX_UPLOAD_BYTES // len(chunk) + 2):
            yield chunk

    r = httpx.post(
        f"{service.url}/datasets",
        headers={**auth(service.keys[0]), "Content-Type": "multipart/form-data; boundary=b"},
        content=body(),
        timeout=60,
    )
    assert r.status_code == 413, r.text

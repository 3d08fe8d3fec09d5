"""Uploaded data sets over real HTTP: upload an RGB set made of real MNIST digits, train a
job on it, predict with its model; tenancy and refusals. SQLite and PostgreSQL."""

from __future__ import annotations

import gzip
import io
import os
import struct
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from core.datasets import MAX_UPLOAD_BYTES
from core.owners import owner_id
from core.train.data import IDX_FILES, load_dataset
from tests.memory import peak_growth_mib
from tests.service import REPO, Service, trained
from tests.uploads import image, zip_bytes

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


def npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


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
    r = upload(service, npz(**rgb_digits))  # ~1.9 MB: over the app's 1 MiB body limit
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    assert r.headers["location"] == f"/datasets/{out['id']}"
    return out


@pytest.fixture(scope="module")
def job(service: Service, dataset: dict[str, Any]) -> dict[str, Any]:
    return trained(service.client(), {"dataset": dataset["dataset"], "epochs": 2, "batch_size": 64})


@pytest.fixture(scope="module")
def rgb64_digits(rgb_digits: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same real digits, scaled up to 3×64×64: 256 of them are 3,145,728 numbers, the
    most one JSON request may carry."""
    out = dict(rgb_digits)
    for key in ("x_train", "x_test"):
        x = torch.from_numpy(rgb_digits[key]).float()
        big = torch.nn.functional.interpolate(x, size=(64, 64), mode="bilinear")
        out[key] = big.round().clamp(0, 255).to(torch.uint8).numpy()
    return out


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
    blank = np.zeros((8, 8, 8), np.uint8)
    constant = npz(x_train=blank, y_train=np.arange(8) % 2, x_test=blank, y_test=np.arange(8) % 2)
    folders = {
        f"{k}/{i}.png": image("L", (8, 8), 9 * i) for k in ("ok", "\u202egnp") for i in range(3)
    }
    for blob, words in [
        (pickled.getvalue(), "pickled"),
        (b"plain text", "not an .npz or .zip"),
        (constant, "a standard deviation of 0"),
        (zip_bytes(folders), "class folder '\\u202egnp': send plain text"),
    ]:
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


def fixed_width_json(images: torch.Tensor) -> bytes:
    """`{"images": [...]}` with every number printed to nine decimals, as a client that
    writes fixed-width numbers sends it: 12 bytes a number."""

    def nested(x: torch.Tensor) -> str:
        if x.dim() == 1:
            return "[" + ",".join(map("{:.9f}".format, x.tolist())) + "]"
        return "[" + ",".join(nested(part) for part in x) + "]"

    return f'{{"images": {nested(images)}}}'.encode()


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_a_3x64x64_model_takes_256_json_images_and_downloads_with_check(
    service: Service, rgb64_digits: dict[str, np.ndarray], tmp_path: Path
) -> None:
    r = upload(service, npz(**rgb64_digits))
    assert r.status_code == 201, r.text
    assert r.json()["image_shape"] == [3, 64, 64]
    job = trained(service.client(), {"dataset": r.json()["dataset"], "epochs": 1, "batch_size": 64})

    held_out = torch.from_numpy(rgb64_digits["x_test"])
    images = torch.cat([held_out, torch.from_numpy(rgb64_digits["x_train"][:56])]).float() / 255
    body = fixed_width_json(images)
    assert len(body) > 33 << 20  # 36 MiB: more than the route once let through for any model
    r = httpx.post(
        f"{service.url}/jobs/{job['id']}/predict",
        headers={**auth(service.keys[0]), "Content-Type": "application/json"},
        content=body,
        timeout=TIMEOUT,
    )
    assert r.status_code == 200, r.text[:500]
    predictions = r.json()["predictions"]
    assert len(predictions) == 256 and all(len(p["probabilities"]) == 10 for p in predictions)
    classes = torch.tensor([p["class"] for p in predictions[:N_TEST]])
    assert (classes == torch.from_numpy(rgb64_digits["y_test"])).float().mean() > 0.2

    out = tmp_path / "model.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env.update(TRAINQ_API_URL=service.url, TRAINQ_API_KEY=service.keys[0])
    done = subprocess.run(
        [sys.executable, "-m", "cli", "download", job["id"], "-o", str(out), "--check"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert "3×64×64 images in, logits shape (1, 10)" in done.stderr


def idx_gzip_bomb(data_dir: Path) -> bytes:
    """The four real mnist-sample IDX files, zipped, but for train-images.gz: an honest
    header (90,000 digits of 28×28, 71 MB: within upload_max_images) over zeros, ~70 KiB
    of gzip."""
    raw = data_dir / "mnist-sample" / "MNIST" / "raw"
    n = 90_000
    header = bytes([0, 0, 0x08, 3]) + struct.pack(">3I", n, 28, 28)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in IDX_FILES[1:]:
            zf.writestr(f"mnist/{name}", (raw / name).read_bytes())
        bomb = gzip.compress(header + bytes(n * 28 * 28), compresslevel=9)
        zf.writestr(f"mnist/{IDX_FILES[0]}.gz", bomb)
    return buf.getvalue()


def test_a_gzip_bomb_is_413_and_costs_the_api_little_memory(
    service: Service, data_dir: Path
) -> None:
    assert service.api is not None
    blob = idx_gzip_bomb(data_dir)
    assert len(blob) < 400 << 10
    r, growth = peak_growth_mib(service.api.pid, lambda: upload(service, blob))
    assert growth < 48, f"a {len(blob)}-byte upload raised the API's peak RSS by {growth} MiB"
    assert r.status_code == 413, r.text
    assert "expands" in r.json()["detail"] and "train-images" in r.json()["detail"]


def npz_with_labels(y_train: bytes) -> bytes:
    """A small set of 8×8 images whose y_train member is the given raw .npy bytes."""
    x, y = np.arange(4 * 64, dtype=np.uint8).reshape(4, 8, 8), np.arange(4) % 2
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for key, array in {"x_train": x, "x_test": x, "y_test": y}.items():
            member = io.BytesIO()
            np.save(member, array)
            zf.writestr(f"{key}.npy", member.getvalue())
        zf.writestr("y_train.npy", y_train)
    return buf.getvalue()


def test_an_npz_declaring_huge_arrays_is_refused_from_its_headers(service: Service) -> None:
    """Labels that a small upload declares (10**9 with no data behind them; 3·10**7 real
    ones that compress 80 times, within the zip-bomb guard) are refused by their .npy
    header, before anything is read or widened to int64 (which would cost 240 MB)."""
    assert service.api is not None
    lying = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        lying, {"descr": "|u1", "fortran_order": False, "shape": (10**9,)}
    )
    many = np.zeros(3 * 10**7, np.uint8)
    many[::40] = np.random.default_rng(0).integers(0, 2, len(many[::40]))
    real = io.BytesIO()
    np.save(real, many)
    for y_train, n in ((lying.getvalue(), 10**9), (real.getvalue(), 3 * 10**7)):
        blob = npz_with_labels(y_train)
        assert len(blob) < 1 << 20
        r, growth = peak_growth_mib(service.api.pid, lambda blob=blob: upload(service, blob))
        assert r.status_code == 413, r.text
        assert r.json()["detail"] == f"y_train: {n} labels: at most 100000 (upload_max_images)"
        assert growth < 48, f"a {len(blob)}-byte upload raised the API's peak RSS by {growth} MiB"


def test_uploads_past_the_limit_are_429(service: Service) -> None:
    """Four uploads at once against one slot: each takes a second or more to check (noise
    images, 31 MB, that do not compress), so at least one finds the slot taken."""
    rng = np.random.default_rng(0)
    noise = npz(
        x_train=rng.integers(0, 256, (36_000, 28, 28), dtype=np.uint8),
        y_train=rng.integers(0, 10, 36_000),
        x_test=rng.integers(0, 256, (4_000, 28, 28), dtype=np.uint8),
        y_test=rng.integers(0, 10, 4_000),
    )
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: upload(service, noise), range(4)))
    codes = sorted(r.status_code for r in answers)
    assert 429 in codes and set(codes) <= {201, 429}, [r.text[:200] for r in answers]
    busy = next(r for r in answers if r.status_code == 429)
    assert busy.headers["retry-after"] == "5" and "retry shortly" in busy.json()["detail"]
    # Shaped as every quota's refusal (test_quotas.py): the limit, its value, the usage, the key.
    assert {k: v for k, v in busy.json().items() if k != "detail"} == {
        "limit": "max_parallel_uploads",
        "value": 1,
        "usage": 1,
        "owner": owner_id(service.keys[0]),
        "retry_after_s": 5,
    }
    assert upload(service, noise).status_code == 201  # the slot is free again


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

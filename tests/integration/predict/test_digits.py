"""POST /jobs/{id}/predict over real HTTP with a real trained job: real held-out digits as
JSON arrays and as PNG/JPEG files, who may ask, and a stored model that fails its check;
SQLite and PostgreSQL."""

from __future__ import annotations

import io
import math
import uuid
from typing import Any, NamedTuple

import httpx
import pytest
import torch
from PIL import Image
from sqlalchemy import update

from core.db import Artifact, Database
from tests.integration.predict.calls import N_DIGITS, auth, png, predict, zeros
from tests.service import Service, wait_until

# A model trained for the module (about 40 s): the full run, not --fast.
pytestmark = pytest.mark.slow


class Classified(NamedTuple):
    images: torch.Tensor  # (N, 1, 28, 28) uint8
    labels: torch.Tensor
    result: dict[str, Any]  # the answer for all of them, sent as H×W JSON arrays


@pytest.fixture(scope="module")
def classified(
    service: Service, job_id: str, digits: tuple[torch.Tensor, torch.Tensor]
) -> Classified:
    images, labels = digits
    body = {"images": (images.float() / 255).squeeze(1).tolist()}  # H×W arrays
    r = predict(service, job_id, json=body)
    assert r.status_code == 200, r.text
    return Classified(images, labels, r.json())


def test_json_digits_are_classified(service: Service, job_id: str, classified: Classified) -> None:
    preds = classified.result["predictions"]
    assert len(preds) == N_DIGITS
    classes = torch.tensor([p["class"] for p in preds])
    assert (classes == classified.labels).float().mean().item() >= 0.9
    for p in preds:
        probs = p["probabilities"]
        assert len(probs) == 10 and all(0 <= q <= 1 for q in probs)
        assert math.isclose(sum(probs), 1, abs_tol=1e-4)
        assert p["class"] == max(range(10), key=probs.__getitem__)
    # The model that answered is the job's stored model (its ETag is its sha256).
    fmt = classified.result["model_format"]
    head = httpx.head(
        f"{service.url}/jobs/{job_id}/model?format={fmt}", headers=auth(service.keys[0])
    )
    assert head.headers["etag"] == f'"{classified.result["model_sha256"]}"'


def test_json_c_h_w_arrays_and_invert(
    service: Service, job_id: str, classified: Classified
) -> None:
    x = classified.images[:8].float() / 255
    expected = [p["class"] for p in classified.result["predictions"][:8]]
    r = predict(service, job_id, json={"images": x.tolist()})  # 1×28×28 arrays
    assert r.status_code == 200, r.text
    assert [p["class"] for p in r.json()["predictions"]] == expected
    r = predict(service, job_id, json={"images": (1 - x).tolist()}, params={"invert": "true"})
    assert r.status_code == 200, r.text
    assert [p["class"] for p in r.json()["predictions"]] == expected


def test_png_files_match_json(service: Service, job_id: str, classified: Classified) -> None:
    images, want = classified.images, classified.result
    n = 8
    files = [("files", (f"digit{i}.png", png(images[i, 0]), "image/png")) for i in range(n)]
    r = predict(service, job_id, files=files)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model_sha256"] == want["model_sha256"]
    for got, expected in zip(out["predictions"], want["predictions"][:n], strict=True):
        assert got["class"] == expected["class"]
        assert got["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-5)

    # Black on white, with the form field `invert`: the same pixels once inverted back.
    files = [("files", (f"ink{i}.png", png(255 - images[i, 0]), "image/png")) for i in range(n)]
    r = predict(service, job_id, files=files, data={"invert": "true"})
    assert r.status_code == 200, r.text
    assert [p["class"] for p in r.json()["predictions"]] == [
        p["class"] for p in want["predictions"][:n]
    ]


def test_larger_rgb_jpeg_is_resized(service: Service, job_id: str, classified: Classified) -> None:
    n = 8
    files = []
    for i in range(n):
        img = Image.fromarray(classified.images[i, 0].numpy()).convert("RGB").resize((112, 112))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=95)
        files.append(("files", (f"digit{i}.jpg", buf.getvalue(), "image/jpeg")))
    r = predict(service, job_id, files=files)
    assert r.status_code == 200, r.text
    got = [p["class"] for p in r.json()["predictions"]]
    want = [p["class"] for p in classified.result["predictions"][:n]]
    assert sum(g == w for g, w in zip(got, want, strict=True)) >= n - 2  # JPEG is lossy


def test_jobs_that_are_not_visible_or_not_done(service: Service, job_id: str) -> None:
    body = zeros(1)
    r = httpx.post(f"{service.url}/jobs/{job_id}/predict", json=body)
    assert r.status_code == 401
    assert predict(service, str(uuid.uuid4()), json=body).status_code == 404
    assert predict(service, job_id, key=service.keys[1], json=body).status_code == 404
    assert predict(service, job_id, key=service.admin_key, json=body).status_code == 200

    c = service.client()
    busy = c.submit({"epochs": 50})
    r = predict(service, busy["id"], json=body)
    assert r.status_code == 409 and "no model yet" in r.json()["detail"], r.text
    c.cancel(busy["id"])
    wait_until(lambda: c.job(busy["id"])["status"] == "canceled", 60, "the job to stop")
    assert predict(service, busy["id"], json=body).status_code == 409


def test_stored_model_failing_its_sha256_is_500(service: Service, job_id: str) -> None:
    """A stored hash that does not match the stored bytes: never loaded, never cached."""
    db = Database(service.database_url)
    try:
        with db.writer() as s:
            real = s.get(Artifact, (job_id, "onnx"))  # the format predict runs
            assert real is not None
            sha = real.sha256
            s.execute(
                update(Artifact)
                .where(Artifact.job_id == job_id, Artifact.format == "onnx")
                .values(sha256="0" * 64)
            )
        r = predict(service, job_id, json=zeros(1))
        assert r.status_code == 500 and "sha256" in r.json()["detail"], r.text
        with db.writer() as s:
            s.execute(
                update(Artifact)
                .where(Artifact.job_id == job_id, Artifact.format == "onnx")
                .values(sha256=sha)
            )
        assert predict(service, job_id, json=zeros(1)).status_code == 200
    finally:
        db.dispose()

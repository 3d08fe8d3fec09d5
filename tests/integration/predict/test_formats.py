"""The model in each format over real HTTP: downloaded with its own ETag, media type and
file name, loaded as a user would (onnxruntime for ONNX) and classifying real held-out
digits as TorchScript does; which format predict runs; a format a job does not offer."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
import torch

from core.spec import ExportFormat
from core.train.verify_export import load_model
from tests.integration.predict.calls import auth, predict
from tests.service import Service, trained

MEDIA_TYPES = {
    "torchscript": "application/octet-stream",
    "pt2": "application/zip",
    "onnx": "application/x-protobuf",
}


def model_url(service: Service, job_id: str, fmt: str) -> str:
    return f"{service.url}/jobs/{job_id}/model?format={fmt}"


@pytest.mark.parametrize("fmt", list(ExportFormat))
def test_each_format_downloads_with_its_etag_and_classifies_as_torchscript(
    service: Service,
    job_id: str,
    digits: tuple[torch.Tensor, torch.Tensor],
    fmt: ExportFormat,
    tmp_path: Path,
) -> None:
    c = service.client()
    assert c.job(job_id)["links"]["models"][fmt] == f"/jobs/{job_id}/model?format={fmt}"
    sha = c.download(job_id, tmp_path / f"model{fmt.suffix}", format=fmt).sha256
    blob = (tmp_path / f"model{fmt.suffix}").read_bytes()
    assert hashlib.sha256(blob).hexdigest() == sha

    head = httpx.head(model_url(service, job_id, fmt), headers=auth(service.keys[0]))
    assert head.status_code == 200
    assert head.headers["etag"] == f'"{sha}"'
    assert head.headers["content-type"] == MEDIA_TYPES[fmt]
    assert head.headers["content-length"] == str(len(blob))
    assert head.headers["content-disposition"].endswith(f'filename="trainq-{job_id}{fmt.suffix}"')
    again = httpx.get(
        model_url(service, job_id, fmt),
        headers={**auth(service.keys[0]), "If-None-Match": f'"{sha}"'},
    )
    assert again.status_code == 304 and again.content == b""

    x = digits[0].float() / 255
    ts = tmp_path / "model.pt"
    c.download(job_id, ts)  # the default format
    with torch.inference_mode():
        want = load_model("torchscript", ts.read_bytes())(x)
        got = load_model(fmt, blob)(x)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(1), want.argmax(1))


def test_predict_answers_with_onnx_and_its_etag(service: Service, job_id: str) -> None:
    r = predict(service, job_id, json={"images": [[[0.0] * 28] * 28]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model_format"] == "onnx"
    head = httpx.head(model_url(service, job_id, "onnx"), headers=auth(service.keys[0]))
    assert head.headers["etag"] == f'"{out["model_sha256"]}"'


def test_an_unknown_format_is_422(service: Service, job_id: str) -> None:
    r = httpx.get(model_url(service, job_id, "bogus"), headers=auth(service.keys[0]))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", "format"]


def test_a_format_the_spec_left_out_is_409_saying_why(service: Service) -> None:
    c = service.client()
    job = trained(c, {"epochs": 1, "max_steps": 3, "export": ["torchscript"]})
    assert list(job["links"]["models"]) == ["torchscript"]
    for fmt in ("onnx", "pt2"):
        r = httpx.get(model_url(service, job["id"], fmt), headers=auth(service.keys[0]))
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert f"offers no {fmt} model" in detail and "did not ask for it" in detail
        assert "Formats offered: torchscript" in detail
    assert set(c.record(job["id"])["formats"]) == {"torchscript"}
    # Predict falls back to the format the job has.
    r = predict(service, job["id"], json={"images": [[[0.0] * 28] * 28]})
    assert r.status_code == 200 and r.json()["model_format"] == "torchscript", r.text


def test_a_format_named_twice_is_422_on_export(service: Service) -> None:
    r = httpx.post(
        f"{service.url}/jobs",
        json={"export": ["onnx", "torchscript", "onnx"]},
        headers=auth(service.keys[0]),
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "export"]

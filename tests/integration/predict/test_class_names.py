"""Class names to the end, over real HTTP with real trained jobs: mnist-sample's job names
the digits "0".."9", a job on an uploaded class-folder zip of real digits names its folders;
predict answers the top-k labels by name, the confusion matrix's rows sum to the evaluation
split's class counts, and the CLI shows both."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from core.train.data import load_dataset
from tests.cli_runs import Ran, run_trainq
from tests.integration.predict.calls import auth, png, predict
from tests.service import Service, trained

pytestmark = pytest.mark.slow  # two trained jobs

DIGITS = [str(d) for d in range(10)]
FOLDERS = {0: "digit0", 1: "digit1", 7: "digit7"}  # class folder name of each real digit
PER_CLASS = 50


def confusion(service: Service, job_id: str, **params: int) -> httpx.Response:
    return httpx.get(
        f"{service.url}/jobs/{job_id}/confusion", params=params, headers=auth(service.keys[0])
    )


def test_mnist_predict_names_the_digits_most_probable_first(
    service: Service, job_id: str, digits: tuple[torch.Tensor, torch.Tensor]
) -> None:
    images, _ = digits
    body = {"images": (images[:8].float() / 255).squeeze(1).tolist()}
    out = predict(service, job_id, json=body).json()
    assert out["classes"] == DIGITS
    for p in out["predictions"]:
        assert p["label"] == str(p["class"])
        top = p["top"]
        assert len(top) == 5  # the default k
        assert top[0]["label"] == p["label"]
        assert [t["probability"] for t in top] == sorted(
            (t["probability"] for t in top), reverse=True
        )
        for t in top:
            assert t["label"] == DIGITS[t["class"]]
            assert t["probability"] == p["probabilities"][t["class"]]
    few = predict(service, job_id, json=body, params={"k": 2}).json()["predictions"]
    assert all(len(p["top"]) == 2 for p in few)
    many = predict(service, job_id, json=body, params={"k": 50}).json()["predictions"]
    assert all(len(p["top"]) == 10 for p in many)  # no more than there are classes
    assert predict(service, job_id, json=body, params={"k": 0}).status_code == 422


def test_mnist_confusion_rows_sum_to_the_test_splits_class_counts(
    service: Service, job_id: str, data_dir: Path
) -> None:
    labels = load_dataset("mnist-sample", data_dir).test.labels
    counts = torch.bincount(labels, minlength=10).tolist()
    last = confusion(service, job_id)
    assert last.status_code == 200, last.text
    figures = last.json()
    assert figures["epoch"] == 2 and figures["classes"] == DIGITS
    assert [sum(row) for row in figures["confusion"]] == figures["class_counts"] == counts
    assert figures["top5_accuracy"] is None  # ten classes: no top-5
    right = sum(figures["confusion"][k][k] for k in range(10))
    assert right / len(labels) == pytest.approx(figures["test_accuracy"])
    assert confusion(service, job_id, epoch=1).json()["epoch"] == 1
    missing = confusion(service, job_id, epoch=3)
    assert missing.status_code == 404 and "no epoch 3" in missing.json()["detail"]


@pytest.fixture(scope="module")
def folder_job(service: Service, data_dir: Path) -> tuple[dict[str, Any], torch.Tensor]:
    """A job on an upload of class folders of real digits (0, 1 and 7), and held-out 7s."""
    train = load_dataset("mnist-sample", data_dir).train
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for digit, folder in FOLDERS.items():
            images = train.images[train.labels == digit][:PER_CLASS, 0]
            for i, pixels in enumerate(images):
                zf.writestr(f"{folder}/{i}.png", png(pixels))
    r = httpx.post(
        f"{service.url}/datasets",
        headers=auth(service.keys[0]),
        files={"file": ("digits.zip", buf.getvalue(), "application/zip")},
        data={"name": "three digits"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    job = trained(service.client(), {"dataset": r.json()["dataset"], "epochs": 3})
    held_out = load_dataset("mnist-sample", data_dir).test
    return job, held_out.images[held_out.labels == 7][:6, 0]


def test_an_uploaded_folder_zip_answers_with_its_folder_names(
    service: Service, folder_job: tuple[dict[str, Any], torch.Tensor]
) -> None:
    job, sevens = folder_job
    assert service.client().record(job["id"])["dataset"]["classes"] == sorted(FOLDERS.values())
    files = [("files", (f"{i}.png", png(x), "image/png")) for i, x in enumerate(sevens)]
    r = predict(service, job["id"], files=files)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["classes"] == sorted(FOLDERS.values())
    labels = [p["label"] for p in out["predictions"]]
    assert labels.count("digit7") >= 4, labels
    for p in out["predictions"]:  # three classes: every one of them, by name
        assert sorted(t["label"] for t in p["top"]) == sorted(FOLDERS.values())


def test_the_folder_jobs_confusion_counts_its_evaluation_split(
    service: Service, folder_job: tuple[dict[str, Any], torch.Tensor]
) -> None:
    job, _ = folder_job
    figures = confusion(service, job["id"]).json()
    assert figures["classes"] == sorted(FOLDERS.values())
    ds_id = job["spec"]["dataset"].removeprefix("ds:")
    placed = service.data_dir / "datasets" / "by-id" / f"{ds_id}.npz"
    with np.load(placed, allow_pickle=False) as npz:
        counts = np.bincount(npz["y_test"], minlength=3).tolist()
    assert [sum(row) for row in figures["confusion"]] == counts


def test_the_cli_shows_the_confusion_and_the_top_labels(
    service: Service,
    folder_job: tuple[dict[str, Any], torch.Tensor],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    job, sevens = folder_job
    env = {"TRAINQ_API_URL": service.url, "TRAINQ_API_KEY": service.keys[0]}
    ran: Ran = run_trainq(capsys, monkeypatch, ["confusion", job["id"][:8]], env)
    assert ran.returncode == 0, ran.stderr
    header = ran.stdout.splitlines()[1].split()
    assert header[-5:] == [*sorted(FOLDERS.values()), "count", "accuracy"]
    image = tmp_path / "seven.png"
    image.write_bytes(png(sevens[0]))
    ran = run_trainq(capsys, monkeypatch, ["predict", job["id"], str(image), "--top", "2"], env)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith(f"{image}: digit")
    assert len(lines) == 3 and all(
        line.strip().split()[0] in FOLDERS.values() for line in lines[1:]
    )
    ran = run_trainq(capsys, monkeypatch, ["predict", job["id"], str(tmp_path / "none.png")], env)
    assert ran.returncode == 1 and "not an image file" in ran.stderr

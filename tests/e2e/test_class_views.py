"""The job view's class names in a real browser: the confusion matrix as a heat map with
the class names, and the predict panel answering a real held-out digit with its labels and
bars."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
from PIL import Image
from playwright.sync_api import expect

from core.train.data import load_dataset
from tests.e2e.test_dashboard import page_errors
from tests.service import Service

DIGITS = [str(d) for d in range(10)]


def digit_png(data_dir: Path) -> bytes:
    test = load_dataset("mnist-sample", data_dir).test
    buf = io.BytesIO()
    Image.fromarray(test.images[0, 0].numpy()).save(buf, format="PNG")
    return buf.getvalue()


def test_confusion_heat_map_and_predict_panel(page: Any, service: Service, data_dir: Path) -> None:
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {service.keys[0]}"}
    ) as http:
        job_id = http.post("/jobs", json={"epochs": 1, "batch_size": 128}).json()["id"]
    page.goto(f"{service.url}/#/jobs/{job_id}")
    page.fill("#api-key", service.keys[0])
    page.click("#login")
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=300_000)

    confusion = page.locator("#confusion")
    expect(confusion).to_have_attribute("data-classes", "10")
    header = confusion.locator("thead th")
    expect(header).to_have_count(12)  # the corner, ten digits, the accuracy
    assert header.all_text_contents()[1:11] == DIGITS
    expect(confusion.locator("tbody tr")).to_have_count(10)

    expect(page.locator("#predict-card")).to_be_visible()
    page.set_input_files(
        "#predict-files",
        files=[{"name": "digit.png", "mimeType": "image/png", "buffer": digit_png(data_dir)}],
    )
    prediction = page.locator(".prediction")
    expect(prediction).to_have_count(1)
    expect(prediction.locator(".predict-row")).to_have_count(5)
    assert prediction.get_attribute("data-label") in DIGITS
    assert not page_errors(page), page.problems

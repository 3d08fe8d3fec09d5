"""The dashboard's layout in Chromium at 1024, 1440 and 1920 px wide, on jobs of every
kind: nothing overflows the card that holds it, the submit form never covers the job list,
a job trained on the CPU shows no GPU-memory chart, a job that ended before its first step
says so instead of waiting for data, a job offers one download per format it exported (its
default first), and the compare page holds a table of final metrics and an x axis that
lines up runs of different batch sizes. Each width's pages are saved as screenshots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from core.train.data import load_dataset
from tests.e2e.layout import EMPTY_CARDS, OVERFLOWS
from tests.service import Service, wait_until
from tests.uploads import npz_bytes

WIDTHS = (1024, 1440, 1920)
# The width from which the list and the form stand side by side (style.css).
SIDE_BY_SIDE = 1440
TERMINAL = ("succeeded", "failed", "canceled", "pruned")
NO_DATA = "no data: the job ended before its first step"

# For each series of a uPlot chart: the x of its last point.
LAST_X = """(selector) => {
  const u = charts.get(document.querySelector(selector));
  const xs = u.data[0];
  return u.data.slice(1).map((ys) => {
    let last = null;
    ys.forEach((y, i) => { if (y !== null && y !== undefined) last = xs[i]; });
    return last;
  });
}"""


def boxes_overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def ended(c: Any, job_id: str) -> dict[str, Any]:
    return wait_until(
        lambda: (job := c.job(job_id))["status"] in TERMINAL and job,
        180,
        f"job {job_id} to end",
        interval=0.2,
    )


@pytest.fixture(scope="module")
def digits(service: Service, data_dir: Path) -> str:
    """Every 12th training and 10th test digit of mnist-sample (all ten classes), uploaded
    as a data set of their own: an epoch of it, on a small network, takes a moment where
    mnist-sample's takes many."""
    sample = load_dataset("mnist-sample", data_dir)
    blob = npz_bytes(
        x_train=sample.train.images[::12].numpy(),
        y_train=sample.train.labels[::12].numpy(),
        x_test=sample.test.images[::10].numpy(),
        y_test=sample.test.labels[::10].numpy(),
    )
    r = httpx.post(
        f"{service.url}/datasets",
        headers={"Authorization": f"Bearer {service.keys[0]}"},
        files={"file": ("digits.npz", blob, "application/octet-stream")},
        data={"name": "a few digits"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["dataset"])


@pytest.fixture(scope="module")
def jobs(service: Service, digits: str) -> dict[str, dict[str, Any]]:
    """Three jobs on the CPU worker: one canceled while queued (no step at all), and two
    one-epoch runs of different batch sizes, one exporting ONNX and TorchScript (TorchScript
    its default), the other ONNX alone (ONNX its default)."""
    c = service.client()
    base = {
        **{"dataset": digits, "epochs": 1, "augment": "none", "ema_decay": None},
        **{"conv1_channels": 8, "conv2_channels": 16, "conv3_channels": 0, "hidden": 32},
    }
    small = c.submit({**base, "batch_size": 32, "export": ["onnx", "torchscript"]})
    large = c.submit({**base, "batch_size": 128, "export": ["onnx"]})
    never = c.submit({**base, "priority": "low"})  # taken after the other two, if ever
    c.cancel(never["id"])  # still queued behind them: no step, no epoch
    out = {name: ended(c, j["id"]) for name, j in [("small", small), ("large", large)]}
    out["never"] = ended(c, never["id"])
    assert out["small"]["status"] == out["large"]["status"] == "succeeded", out
    assert out["never"]["status"] == "canceled" and out["never"]["progress"]["step"] == 0, out
    return out


@pytest.mark.slow
def test_dashboard_layout(
    page: Any, service: Service, jobs: dict[str, dict[str, Any]], artifacts_dir: Path
) -> None:
    small, large, never = jobs["small"], jobs["large"], jobs["never"]
    page.goto(f"{service.url}/")
    page.fill("#api-key", service.keys[0])
    page.click("#login")
    problems: list[str] = []

    def check(where: str) -> None:
        problems.extend(f"{where}: {p}" for p in page.evaluate(OVERFLOWS))
        problems.extend(f"{where}: empty card {p!r}" for p in page.evaluate(EMPTY_CARDS))

    def shoot(name: str, width: int) -> None:
        page.wait_for_timeout(200)  # the coalesced redraw of the plots
        page.screenshot(path=str(artifacts_dir / f"layout-{name}-{width}.png"), full_page=True)

    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})

        page.goto(f"{service.url}/#/")
        expect(page.locator(f'#jobs tr[data-job-id="{never["id"]}"]')).to_be_visible()
        expect(page.locator("#spec-fields [name=epochs]")).to_be_visible()
        shoot("jobs", width)
        check(f"jobs at {width}")
        jobs_card = page.locator("#jobs").bounding_box()
        list_card = page.locator("#home-view .card.grow").bounding_box()
        form_card = page.locator("#home-view .card.side").bounding_box()
        if boxes_overlap(jobs_card, form_card):
            problems.append(f"jobs at {width}: the form {form_card} covers the table {jobs_card}")
        if width < SIDE_BY_SIDE and form_card["y"] < list_card["y"] + list_card["height"]:
            problems.append(f"jobs at {width}: the form is beside the list, not below it")

        # Trained on the CPU: no GPU-memory chart, a one-line note instead.
        page.goto(f"{service.url}/#/jobs/{small['id']}")
        expect(page.locator("#job-status")).to_have_text("succeeded")
        expect(page.locator("#loss-plot")).to_have_attribute(
            "data-points", str(small["result"]["steps"])
        )
        shoot("job-cpu", width)
        check(f"CPU job at {width}")
        if page.locator("#memory-plot").is_visible():
            problems.append(f"CPU job at {width}: the GPU-memory chart is shown")
        note = page.locator("#memory-note")
        if not (note.is_visible() and "CPU" in (note.text_content() or "")):
            problems.append(f"CPU job at {width}: no note that it trained on the CPU")
        # One button per exported format, the default first.
        buttons = page.locator("#downloads button")
        formats = buttons.evaluate_all("bs => bs.map(b => b.dataset.format)")
        default = small["default_format"]
        if formats != [default, *[f for f in small["formats"] if f != default]]:
            problems.append(f"CPU job: download buttons {formats} for {small['formats']}")

        # Ended before its first step: the plots say so, not "waiting for data…".
        page.goto(f"{service.url}/#/jobs/{never['id']}")
        expect(page.locator("#job-status")).to_have_text("canceled")
        expect(page.locator("#stream-state")).to_have_text("stream complete")
        for plot in ("#loss-plot", "#lr-plot", "#accuracy-plot"):
            try:
                expect(page.locator(plot)).to_have_attribute("data-note", NO_DATA, timeout=5_000)
            except AssertionError:
                said = page.locator(plot).get_attribute("data-note")
                problems.append(f"ended job at {width}: {plot} says {said!r}")
        shoot("job-ended", width)
        check(f"ended job at {width}")

        # Compare: a table of final metrics, an x axis that lines the runs up.
        page.goto(f"{service.url}/#/compare/{small['id']},{large['id']}")
        expect(page.locator("#compare-loss-plot")).to_have_attribute("data-series", "2")
        rows = page.locator("#compare-final tbody tr")
        if rows.count() != 2:
            problems.append(f"compare at {width}: {rows.count()} rows of final metrics")
        shoot("compare", width)
        check(f"compare at {width}")

    assert not problems, "\n".join(problems)

    # The x axis: by steps the runs end apart (a quarter of the batch takes about four times
    # the steps), by epochs together, by images seen within one batch of each other.
    page.goto(f"{service.url}/#/compare/{small['id']},{large['id']}")
    expect(page.locator("#compare-loss-plot")).to_have_attribute("data-series", "2")
    axis = page.locator("#compare-x")
    assert axis.locator("option").evaluate_all("os => os.map(o => o.value)") == [
        "steps",
        "epochs",
        "images",
    ]
    by_steps = page.evaluate(LAST_X, "#compare-loss-plot")
    assert by_steps == [small["result"]["steps"], large["result"]["steps"]]
    axis.select_option("epochs")
    assert page.evaluate(LAST_X, "#compare-loss-plot") == [1, 1]
    assert page.evaluate(LAST_X, "#compare-accuracy-plot") == [1, 1]
    axis.select_option("images")
    seen = page.evaluate(LAST_X, "#compare-loss-plot")
    assert abs(seen[0] - seen[1]) < large["spec"]["batch_size"], seen
    assert page.locator("#compare-x").input_value() == "images"

    # The job that exported ONNX alone downloads ONNX from its only button.
    page.goto(f"{service.url}/#/jobs/{large['id']}")
    expect(page.locator("#downloads button")).to_have_count(1)
    with page.expect_download() as downloading:
        page.click('#downloads button[data-format="onnx"]')
    assert downloading.value.suggested_filename.endswith(".onnx")
    expect(page.locator("#job-message")).to_be_hidden()
    assert not [p for p in page.problems if "Failed to load resource" not in p], page.problems

"""The sweep page and the compare view in a real browser against the real service: a small
grid sweep followed live to its end (one trial succeeds, two are pruned), its uPlot plots,
the trial table sorted by a header, two trials compared side by side, and the trials as jobs
in the job list and on their own page."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from tests.e2e.layout import EMPTY_CARDS, OVERFLOWS
from tests.service import Service
from tests.sweeps import GRID_BASE, GRID_SWEEP

BASE, GRID = GRID_BASE, GRID_SWEEP
# What the browser reports on its own for the 409 above.
NO_RECORD = "the server responded with a status of 409"


def fmt_lr(lr: float) -> str:
    """A learning rate as the page writes it: 4 significant digits, no exponent."""
    return f"{float(f'{lr:.4g}'):f}".rstrip("0").rstrip(".")


def sign_in(page: Any, service: Service, url: str) -> None:
    page.goto(url)
    page.fill("#api-key", service.keys[0])
    page.click("#login")


def trial_order(page: Any) -> list[int]:
    rows = page.locator("#trials tbody tr")
    return list(rows.evaluate_all("rows => rows.map(r => Number(r.dataset.trial))"))


def expect_drawn(page: Any, chart: str, series: int) -> None:
    """A uPlot chart with `series` series, on a canvas of non-zero size."""
    expect(page.locator(chart)).to_have_attribute("data-series", str(series))
    canvas = page.locator(f"{chart} .uplot canvas")
    expect(canvas).to_have_count(1)
    box = canvas.bounding_box()
    assert box is not None and box["width"] > 100 and box["height"] > 50, (chart, box)


def test_sweep_page_live_sort_compare(page: Any, service: Service, artifacts_dir: Path) -> None:
    c = service.client()
    sweep_id = c.create_sweep(GRID)["id"]
    sign_in(page, service, f"{service.url}/#/sweeps/{sweep_id}")
    expect(page.locator("#sweep-id")).to_have_text(sweep_id)

    # Live: the table grows from the event stream as trials are made, without a reload.
    counts: list[int] = []
    deadline = time.monotonic() + 300
    while True:
        status, rows = page.evaluate(
            "() => [document.querySelector('#sweep-status').dataset.status,"
            " document.querySelectorAll('#trials tbody tr').length]"
        )
        if rows and (not counts or rows != counts[-1]):
            counts.append(rows)
        if status not in ("running", "…"):
            break
        assert time.monotonic() < deadline, f"sweep still {status} after 300 s"
        page.wait_for_timeout(100)
    assert status == "succeeded", page.locator("#sweep-message").text_content()
    assert counts and counts[0] < 3 and counts[-1] == 3, f"trial rows seen: {counts}"
    expect(page.locator("#sweep-stream-state")).to_have_text("stream complete")
    expect(page.locator("#sweep-cancel")).to_be_hidden()

    final = c.sweep(sweep_id)
    trials = {t["number"]: t for t in final["trials"]}
    shown = dict(
        page.locator("#trials tbody tr").evaluate_all(
            "rows => rows.map(r => [Number(r.dataset.trial), r.dataset.status])"
        )
    )
    assert shown == {n: t["status"] for n, t in trials.items()}
    assert sorted(shown.values()) == ["pruned", "pruned", "succeeded"]
    expect(page.locator("#sweep-progress-text")).to_contain_text("3 of 3 trials ended")
    best = final["best"]
    expect(page.locator("#sweep-best-job")).to_have_text(best["job_id"][:8])
    expect(page.locator("#sweep-download")).to_be_visible()

    # The plots: the objective against lr (three trials), and every trial's curves.
    expect_drawn(page, '#sweep-scatter .chart[data-dimension="lr"]', 3)
    expect(page.locator("#sweep-scatter .chart")).to_have_attribute("data-points", "3")
    expect_drawn(page, "#sweep-values-plot", 3)
    expect_drawn(page, "#sweep-loss-plot", 3)
    page.screenshot(path=str(artifacts_dir / "sweep.png"), full_page=True)

    # The legends name each trial by what sets it apart, and show its last value while the
    # cursor is away (not a row of dashes).
    for chart in ("#sweep-values-plot", "#sweep-loss-plot"):
        labels = page.locator(f"{chart} .u-legend .u-label").all_text_contents()
        values = page.locator(f"{chart} .u-legend .u-value").all_text_contents()
        named = [f"trial {n} · lr={fmt_lr(trials[n]['params']['lr'])}" for n in (0, 1, 2)]
        assert labels[1:] == named, labels
        assert all(v.strip() and "–" not in v for v in values[1:]), values

    # Nothing leaves its card, at the narrowest and the widest width.
    for width in (1024, 1920):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(200)  # the charts fit their new width on the resize event
        overflows = page.evaluate(OVERFLOWS)
        assert not overflows, f"at {width} px:\n" + "\n".join(overflows)
        assert page.evaluate(EMPTY_CARDS) == [], width
        page.screenshot(path=str(artifacts_dir / f"sweep-{width}.png"), full_page=True)
    page.set_viewport_size({"width": 1440, "height": 900})

    # Sorting: by lr, then by lr the other way, then by the objective (best first).
    by_lr = sorted(trials, key=lambda n: trials[n]["params"]["lr"])
    assert trial_order(page) == [0, 1, 2]
    page.click('#trials th[data-sort="param:lr"] button')
    expect(page.locator('#trials th[data-sort="param:lr"]')).to_have_attribute(
        "aria-sort", "ascending"
    )
    assert trial_order(page) == by_lr
    page.click('#trials th[data-sort="param:lr"] button')
    assert trial_order(page) == by_lr[::-1]
    page.click('#trials th[data-sort="value"] button')
    page.click('#trials th[data-sort="value"] button')
    assert trial_order(page)[0] == best["number"]

    # Compare the best trial with a pruned one: lr differs, epochs do not; two curves each.
    pruned = next(n for n, t in trials.items() if t["status"] == "pruned")
    compared = [trials[best["number"]]["job_id"], trials[pruned]["job_id"]]
    expect(page.locator("#sweep-compare")).to_be_disabled()
    for job_id in compared:
        page.check(f'#trials tr[data-job-id="{job_id}"] input[type=checkbox]')
    page.click("#sweep-compare")
    page.wait_for_url(f"**/#/compare/{compared[0]},{compared[1]}")
    expect(page.locator('#compare-spec tbody tr[data-field="lr"]')).to_have_class("differs")
    assert page.locator("#compare-spec tbody tr").count() == 1  # lr alone differs
    expect(page.locator('#compare-spec-equal tr[data-field="epochs"]')).to_have_count(1)
    expect_drawn(page, "#compare-loss-plot", 2)
    expect_drawn(page, "#compare-accuracy-plot", 2)
    page.screenshot(path=str(artifacts_dir / "compare.png"), full_page=True)

    # The trials are jobs: pruned ones wear their own badge, and any two can be compared.
    page.goto(f"{service.url}/#/")
    expect(page.locator("#jobs .status-pruned")).to_have_count(2)
    expect(page.locator("#compare-jobs")).to_be_disabled()
    for job_id in compared[::-1]:
        page.check(f'#jobs tr[data-job-id="{job_id}"] input[type=checkbox]')
    page.click("#compare-jobs")
    page.wait_for_url(f"**/#/compare/{compared[1]},{compared[0]}")
    expect_drawn(page, "#compare-loss-plot", 2)

    # A trial's own page names its sweep, and the sweep list holds the sweep.
    page.goto(f"{service.url}/#/jobs/{trials[pruned]['job_id']}")
    expect(page.locator("#job-trial")).to_contain_text(f"trial {pruned} of sweep")
    # A pruned trial has no run record: the page asks, the API answers 409, the page says so.
    expect(page.locator("#record")).to_have_text("No run record for this job.")
    page.click("#job-trial a")
    expect(page.locator("#sweep-id")).to_have_text(sweep_id)
    page.click("#nav >> text=Sweeps")
    expect(page.locator(f'#sweeps tr[data-sweep-id="{sweep_id}"]')).to_contain_text("succeeded")
    unexpected = [p for p in page.problems if NO_RECORD not in p]
    assert not unexpected, page.problems

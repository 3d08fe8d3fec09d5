"""Names, tags and notes in a real browser against the real service: the jobs list's filter
bar (tags, name, status, sort), tag chips that narrow the list, names instead of ids in the
list and in the compare view's legends, a sweep's trials marked as such, a job's labels
changed on its page, and a job named and tagged from the submit form. With the second key,
so that no other test's list changes."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from playwright.sync_api import expect

from client.http import ApiError
from tests.service import Service, wait_until

SMALL = {"epochs": 1, "max_steps": 1, "export": ["torchscript"]}
NETWORK_NOISE = "Failed to load resource"  # the browser's own line for the 422 asked for


def listed(page: Any) -> list[str]:
    return list(
        page.locator("#jobs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.jobId)")
    )


def statuses(page: Any) -> list[str]:
    return list(
        page.locator("#jobs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.status)")
    )


def test_filter_tag_rename_and_name_everywhere(page: Any, service: Service) -> None:
    key = service.keys[1]
    c = service.client(key)
    run = uuid.uuid4().hex[:6]
    alpha = c.submit(SMALL, name=f"alpha {run}", tags=[f"x-{run}", "shared"])
    beta = c.submit({**SMALL, "seed": 1}, name=f"beta {run}", tags=[f"x-{run}"])
    plain = c.submit({**SMALL, "seed": 2}, tags=[f"other-{run}"])
    grid = {"base": SMALL, "space": {"lr": {"choice": [1e-3, 2e-3]}}, "trials": 2, "parallel": 2}
    sweep = c.create_sweep(grid, name=f"grid {run}", tags=[f"sweep-{run}"])

    page.goto(f"{service.url}/")
    page.fill("#api-key", key)
    page.click("#login")
    row = page.locator(f'#jobs tr[data-job-id="{alpha["id"]}"]')
    expect(row).to_contain_text(f"alpha {run}")
    expect(row.locator(".tag")).to_have_text([f"x-{run}", "shared"])

    # A tag typed in the bar: the jobs with it alone.
    page.fill("#filter-tags", f"x-{run}")
    expect(page.locator("#jobs tbody tr")).to_have_count(2)
    assert set(listed(page)) == {alpha["id"], beta["id"]}
    # A name's start, whatever its case.
    page.click("#filter-clear")
    page.fill("#filter-name", f"ALPHA {run}")
    expect(page.locator("#jobs tbody tr")).to_have_count(1)
    assert listed(page) == [alpha["id"]]
    # A chip clicked: its tag joins the filter.
    page.click("#filter-clear")
    expect(page.locator(f'#jobs tr[data-job-id="{plain["id"]}"]')).to_be_visible()
    page.click(f'#jobs tr[data-job-id="{plain["id"]}"] .tag')
    expect(page.locator("#filter-tags")).to_have_value(f"other-{run}")
    expect(page.locator("#jobs tbody tr")).to_have_count(1)
    # The sweep's trials: named after it and marked as its trials.
    page.fill("#filter-tags", f"sweep-{run}")
    expect(page.locator("#jobs tbody tr")).to_have_count(2)
    expect(page.locator("#jobs tbody .trial-mark")).to_have_count(2)
    expect(page.locator("#jobs tbody tr").first).to_contain_text(f"grid {run} #")
    expect(page.locator("#jobs tbody .trial-mark a").first).to_have_text(sweep["id"][:8])
    c.cancel_sweep(sweep["id"])
    # An order by a figure: asked of the API, and only jobs that have it are listed.
    page.click("#filter-clear")
    with page.expect_response(lambda r: "sort=-test_accuracy" in r.url) as sorted_by:
        page.select_option("#filter-sort", "-test_accuracy")
    assert sorted_by.value.ok
    answered = sorted_by.value.json()["items"]
    assert {j["status"] for j in answered} <= {"succeeded"}
    # The table draws that answer (a moment after it arrives; a refresh may add jobs that
    # have since succeeded, never one that has not).
    wait_until(lambda: set(statuses(page)) <= {"succeeded"}, 30, "the sorted list drawn")
    # A tag the API refuses says why, and the last list stays.
    page.click("#filter-clear")
    page.fill("#filter-tags", "no*star")
    expect(page.locator("#jobs-message")).to_contain_text("tag")
    page.click("#filter-clear")
    expect(page.locator("#jobs-message")).to_be_hidden()

    # A job's labels, changed on its page.
    page.goto(f"{service.url}/#/jobs/{plain['id']}")
    expect(page.locator("#job-tags .tag")).to_have_text([f"other-{run}"])
    page.click("#edit-labels")
    page.fill("#labels-form [name=name]", f"gamma {run}")
    page.fill("#labels-form [name=tags]", f"other-{run}, new-{run}")
    page.fill("#labels-form [name=notes]", "tried\nagain")
    page.click("#save-labels")
    expect(page.locator("#job-name")).to_have_text(f"gamma {run}")
    expect(page.locator("#job-tags .tag")).to_have_text([f"other-{run}", f"new-{run}"])
    expect(page.locator("#job-notes")).to_have_text("tried\nagain")
    now = c.job(plain["id"])
    assert (now["name"], now["tags"], now["notes"]) == (
        f"gamma {run}", [f"other-{run}", f"new-{run}"], "tried\nagain"
    )  # fmt: skip
    page.click("#edit-labels")
    page.fill("#labels-form [name=tags]", ", ".join(f"t{i}" for i in range(17)))
    page.click("#save-labels")
    expect(page.locator("#labels-message")).to_contain_text("Not saved: tags")

    # The compare view's legends name the jobs (once they have trained).
    for done in (alpha, beta):
        wait_until(lambda j=done: c.job(j["id"])["status"] == "succeeded", 300, "a job to train")
    page.goto(f"{service.url}/#/compare/{alpha['id']},{beta['id']}")
    expect(page.locator("#compare-loss-plot")).to_have_attribute("data-series", "2")
    labels = page.locator("#compare-loss-plot .u-legend .u-label").all_text_contents()
    assert any(f"alpha {run}" in t for t in labels) and any(f"beta {run}" in t for t in labels)
    expect(page.locator("#compare-final tbody tr").first).to_contain_text(f"alpha {run}")

    # The submit form names and tags the job it submits.
    page.goto(f"{service.url}/#/")
    page.fill("#f-name", f"from the form {run}")
    page.fill("#f-tags", f"form-{run}, e2e")
    page.locator("#submit-form [name=epochs]").fill("1")
    with page.expect_response(
        lambda r: r.url == f"{service.url}/jobs" and r.request.method == "POST"
    ) as posted:
        page.click("#submit")
    made = posted.value.json()
    assert (made["name"], made["tags"]) == (f"from the form {run}", [f"form-{run}", "e2e"])
    assert "name" not in made["spec"]
    with contextlib.suppress(ApiError):  # 409 if it ended already
        c.cancel(made["id"])
    problems = [p for p in page.problems if NETWORK_NOISE not in p]
    assert not problems, problems

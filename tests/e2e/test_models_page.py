"""The model registry's pages in a real browser: the key's models with their aliases, one
model's versions with their metrics and lineage, each alias's moves, and the form that
moves an alias, which refuses (and says so) when another move came first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from tests.e2e.layout import OVERFLOWS
from tests.e2e.test_dashboard import page_errors
from tests.service import Service, trained

TINY = {
    "conv1_channels": 4,
    "conv2_channels": 4,
    "conv3_channels": 0,
    "hidden": 8,
    "augment": "none",
    "ema_decay": None,
    "batch_size": 256,
    "epochs": 1,
    "max_steps": 3,
    "export": ["torchscript"],
}


def test_models_versions_and_moving_an_alias(
    page: Any, service: Service, artifacts_dir: Path
) -> None:
    c = service.client()
    jobs = [trained(c, {**TINY, "seed": seed}) for seed in (1, 2)]
    for job in jobs:
        c.register_model(job["id"], "digits")
    c.move_alias("digits", "production", 1)

    page.goto(f"{service.url}/#/models")
    page.fill("#api-key", service.keys[0])
    page.click("#login")
    row = page.locator('#models tbody tr[data-model="digits"]')
    expect(row).to_contain_text("production → 1")
    expect(row.locator("td").nth(2)).to_have_text("2")
    row.locator("a").click()

    expect(page.locator("#model-name")).to_have_text("digits")
    versions = page.locator("#versions tbody tr")
    expect(versions).to_have_count(2)
    newest = page.locator('#versions tbody tr[data-version="2"]')
    expect(newest).to_contain_text(jobs[1]["id"][:8])
    expect(newest).to_contain_text("mnist-sample")
    accuracy = f"{jobs[1]['result']['test_accuracy'] * 100:.1f}"
    expect(newest.locator("td").nth(2)).to_contain_text(accuracy[:3])
    newest.locator("summary").click()
    expect(newest.locator("pre")).to_contain_text('"dataset_sha256"')
    expect(page.locator('#aliases tbody tr[data-alias="production"] td').nth(1)).to_have_text("1")

    # Moved from the form: from 1, as the page shows it, to 2.
    page.fill("#move-alias", "production")
    page.select_option("#move-version", "2")
    page.click("#move-submit")
    expect(page.locator("#alias-message")).to_have_text("production → version 2 (was 1)")
    expect(page.locator('#aliases tbody tr[data-alias="production"] td').nth(1)).to_have_text("2")
    assert c.model_version("digits@production")["version"] == 2

    # Someone else moves it back; the page, still showing 2, is refused and says where it is.
    c.move_alias("digits", "production", 1)
    page.select_option("#move-version", "2")
    page.click("#move-submit")
    expect(page.locator("#alias-message")).to_contain_text("points at version 1, not 2")
    expect(page.locator('#aliases tbody tr[data-alias="production"] td').nth(1)).to_have_text("1")
    assert c.model_version("digits@production")["version"] == 1

    page.locator('#aliases tbody tr[data-alias="production"] button').click()
    moves = page.locator("#alias-history-list li")
    expect(moves).to_have_count(3)
    expect(moves.nth(0)).to_contain_text("2 → 1")
    expect(moves.nth(2)).to_contain_text("new → 1")
    for width in (1440, 1024):
        page.set_viewport_size({"width": width, "height": 900})
        assert page.evaluate(OVERFLOWS) == [], width
    page.screenshot(path=str(artifacts_dir / "model-page.png"), full_page=True)
    page.click("text=← all models")
    expect(page.locator("#models tbody tr")).to_have_count(1)
    assert not page_errors(page), page.problems

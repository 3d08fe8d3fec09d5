"""The data-set page in a real browser: a zip of real photos (scikit-image's cat and coffee)
dropped on the page uploads with a progress bar, then the set's classes show with their
counts and thumbnails; the list shows it; a bad zip's refusal is shown, not a new set."""

from __future__ import annotations

import base64
import io
import zipfile
from pathlib import Path
from typing import Any

from PIL import Image
from playwright.sync_api import expect
from skimage import data as photos_data

from tests.e2e.layout import OVERFLOWS
from tests.e2e.test_dashboard import page_errors
from tests.service import Service

# A file dropped on the drop zone, as a user's drag from the desktop delivers it.
DROP = """([name, b64]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const drop = new DataTransfer();
  drop.items.add(new File([bytes], name, { type: "application/zip" }));
  const zone = document.querySelector("#dropzone");
  const how = { dataTransfer: drop, bubbles: true, cancelable: true };
  zone.dispatchEvent(new DragEvent("dragover", how));
  zone.dispatchEvent(new DragEvent("drop", how));
}"""
# The most of the file the progress bar showed sent, read as the upload goes.
WATCH_PROGRESS = """() => {
  window.progressSeen = 0;
  const bar = document.querySelector("#upload-progress");
  const seen = () => { window.progressSeen = Math.max(window.progressSeen, bar.value / bar.max); };
  new MutationObserver(seen).observe(bar, { attributes: true });
}"""


def photo_zip(bad: bool = False) -> str:
    """Two classes of six real-photo crops each, as base64; `bad` adds a broken JPEG."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, photo in (("cat", photos_data.chelsea()), ("cup", photos_data.coffee())):
            img = Image.fromarray(photo)
            for i in range(6):
                crop = img.crop((i * 9, i * 7, img.width - i * 5, img.height - i * 3))
                out = io.BytesIO()
                crop.resize((40, 30)).save(out, "JPEG")
                zf.writestr(f"pets/{name}/{i}.jpg", out.getvalue())
        if bad:
            zf.writestr("pets/cup/broken.jpg", b"\xff\xd8 not a jpeg")
    return base64.b64encode(buf.getvalue()).decode()


def test_drop_a_zip_and_see_its_classes(page: Any, service: Service, artifacts_dir: Path) -> None:
    page.goto(f"{service.url}/#/datasets")
    # The second key: the other pages' tests upload sets with the first, on the same service.
    page.fill("#api-key", service.keys[1])
    page.click("#login")
    expect(page.locator("#dropzone")).to_be_visible()

    # A bad image: the refusal names it, and no set is added.
    page.evaluate(DROP, ["bad.zip", photo_zip(bad=True)])
    expect(page.locator("#upload-message")).to_contain_text("pets/cup/broken.jpg")
    expect(page.locator("#datasets tbody tr")).to_have_count(0)

    page.evaluate(WATCH_PROGRESS)
    page.fill("#upload-size", "24")
    with page.expect_response(lambda r: r.url == f"{service.url}/datasets") as posted:
        page.evaluate(DROP, ["pets.zip", photo_zip()])
    assert posted.value.status == 201, posted.value.text()
    assert posted.value.request.header_value("content-type").startswith("multipart/form-data")
    expect(page.locator("#dataset-view")).to_be_visible()
    assert page.evaluate("window.progressSeen") == 1  # the bar reached the end

    expect(page.locator("#dataset-name")).to_have_text("pets")
    rows = page.locator("#dataset-classes tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator("td").nth(0)).to_have_text("cat")
    expect(rows.nth(1).locator("td").nth(0)).to_have_text("cup")
    expect(rows.nth(0).locator("meter")).to_have_attribute("value", "6")
    expect(page.locator("#dataset-classes thead")).to_contain_text("train")
    thumbs = page.locator("#dataset-classes img.thumb")
    expect(thumbs).to_have_count(6)  # three train images a class
    page.wait_for_function(
        "() => [...document.querySelectorAll('img.thumb')].every((i) => i.naturalWidth === 24)"
    )
    expect(page.locator("#dataset-notes")).to_contain_text("resized from up to 40x30 to 24x24")
    for width in (1440, 1024):
        page.set_viewport_size({"width": width, "height": 900})
        assert page.evaluate(OVERFLOWS) == [], width
    page.screenshot(path=str(artifacts_dir / "dataset-page.png"), full_page=True)

    page.click("text=← all data sets")
    expect(page.locator("#datasets tbody tr")).to_have_count(1)
    expect(page.locator("#datasets tbody tr")).to_contain_text("cat, cup")
    assert page.evaluate(OVERFLOWS) == []
    page.screenshot(path=str(artifacts_dir / "datasets-page.png"), full_page=True)
    assert not page_errors(page), page.problems

"""The web dashboard in a real browser against the real service: sign in, submit a job
from the form built from the JobSpec, watch its loss plot grow live from Server-Sent
Events, see it succeed, download the model, read the run record."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.service import Service

TERMINAL = {"succeeded", "failed", "canceled"}
# What a browser reports on its own for a 4xx response: expected here (wrong key, 422).
NETWORK_NOISE = "Failed to load resource"


def page_errors(page: Any) -> list[str]:
    """Uncaught errors and console errors (a CSP violation, say), less 4xx noise."""
    return [p for p in page.problems if NETWORK_NOISE not in p]


def submitted(page: Any, service: Service) -> Any:
    """The form sent with its submit button: the answer to its POST /jobs, a 201."""
    with page.expect_response(
        lambda r: r.url == f"{service.url}/jobs" and r.request.method == "POST"
    ) as posted:
        page.click("#submit")
    response = posted.value
    assert response.status == 201, response.text()
    return response


def test_dashboard_submit_follow_download(page: Any, service: Service, artifacts_dir: Path) -> None:
    page.goto(f"{service.url}/")

    # A wrong key is refused with a clear message and the page asks again.
    page.fill("#api-key", "not-a-key")
    page.click("#login")
    expect(page.locator("#login-message")).to_contain_text("401")
    expect(page.locator("#api-key")).to_be_visible()
    page.fill("#api-key", service.keys[0])
    page.click("#login")

    # The form is built from the JobSpec schema: one input per field.
    form = page.locator("#submit-form")
    expect(form.locator("[name=epochs]")).to_be_visible()
    spec_fields = httpx.get(f"{service.url}/openapi.json", timeout=10).json()["components"][
        "schemas"
    ]["JobSpec"]["properties"]
    for name, field in spec_fields.items():
        shown = 0 if field.get("readOnly") else 1  # recipe_filled is trainq's to set
        assert form.locator(f"[name={name}]").count() == shown, name

    # An invalid value: the 422 is shown next to the field it names.
    form.locator("[name=epochs]").fill("0")
    page.click("#submit")
    expect(page.locator('[data-error-for="epochs"]')).to_be_visible()
    expect(page.locator('[data-error-for="epochs"]')).to_contain_text("greater than or equal")

    # Submit: only the changed fields are sent.
    form.locator("[name=epochs]").fill("2")
    form.locator("[name=batch_size]").fill("128")
    response = submitted(page, service)
    assert response.request.post_data_json == {"epochs": 2, "batch_size": 128}
    job_id = response.json()["id"]

    row = page.locator(f'#jobs tr[data-job-id="{job_id}"]')
    expect(row).to_be_visible()
    page.screenshot(path=str(artifacts_dir / "dashboard-jobs.png"), full_page=True)
    row.locator("a").click()
    expect(page.locator("#job-id")).to_have_text(job_id)

    # Live: the loss plot grows while the job runs (read in the page, many times).
    readings: list[int] = []
    deadline = time.monotonic() + 300
    while True:
        status, points = page.evaluate(
            "() => [document.querySelector('#job-status').dataset.status,"
            " Number(document.querySelector('#loss-plot').dataset.points)]"
        )
        if status in TERMINAL:
            break
        if points > 0 and (not readings or points != readings[-1]):
            readings.append(points)
        assert time.monotonic() < deadline, f"job still {status} after 300 s"
        page.wait_for_timeout(50)
    assert status == "succeeded", page.locator("#job-error").text_content()
    assert len(readings) >= 2, f"saw the loss plot at {readings} points only before the end"
    assert readings == sorted(readings), readings

    # Finished: the plots hold every step, the result, download and record are shown.
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {service.keys[0]}"}
    ) as http:
        job = http.get(f"/jobs/{job_id}").json()
    steps = job["result"]["steps"]
    expect(page.locator("#job-status")).to_have_text("succeeded")
    expect(page.locator("#loss-plot")).to_have_attribute("data-points", str(steps))
    expect(page.locator("#accuracy-plot")).to_have_attribute("data-points", "2")
    expect(page.locator("#cancel")).to_be_hidden()
    expect(page.locator("#record")).to_contain_text('"spec"')
    record = json.loads(page.locator("#record").text_content())
    assert record["spec"]["epochs"] == 2

    with page.expect_download() as downloading:
        page.click("#download")
    download = downloading.value
    assert download.suggested_filename.endswith(".pt")
    model = Path(download.path()).read_bytes()
    assert len(model) > 0 and model[:2] == b"PK"  # TorchScript: a zip

    page.screenshot(path=str(artifacts_dir / "dashboard.png"), full_page=True)
    assert not page_errors(page), page.problems


def test_a_recipe_chosen_in_the_form_shows_its_knobs_and_sends_what_differs(
    page: Any, service: Service
) -> None:
    page.goto(f"{service.url}/")
    page.fill("#api-key", service.keys[0])
    page.click("#login")
    form = page.locator("#submit-form")
    form.locator("[name=recipe]").select_option("fast")
    expect(form.locator("[name=epochs]")).to_have_value("1")
    expect(form.locator("[name=batch_size]")).to_have_value("256")
    expect(form.locator("[name=ema_decay]")).to_have_value("")
    form.locator("[name=epochs]").fill("8")  # the accurate recipe's: still a change from fast's
    response = submitted(page, service)
    assert response.request.post_data_json == {"recipe": "fast", "epochs": 8}
    spec = response.json()["spec"]
    assert (spec["epochs"], spec["batch_size"], spec["recipe"]) == (8, 256, "fast")
    assert "epochs" not in spec["recipe_filled"]
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {service.keys[0]}"}
    ) as http:
        http.post(f"/jobs/{response.json()['id']}/cancel")
    assert not page_errors(page), page.problems


def test_dashboard_cancel(page: Any, service: Service) -> None:
    """A long job, opened straight by its URL, canceled with the button."""
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {service.keys[0]}"}
    ) as http:
        job_id = http.post("/jobs", json={"epochs": 50}).json()["id"]
    page.goto(f"{service.url}/#/jobs/{job_id}")
    page.fill("#api-key", service.keys[0])
    page.click("#login")
    expect(page.locator("#job-id")).to_have_text(job_id)
    expect(page.locator("#cancel")).to_be_visible()
    page.click("#cancel")
    expect(page.locator("#job-status")).to_have_text("canceled", timeout=120_000)
    expect(page.locator("#cancel")).to_be_hidden()
    expect(page.locator("#download")).to_be_hidden()
    assert not page_errors(page), page.problems


# The page's own SSE reader (EventSource cannot send the Authorization header), run in the
# browser on crafted streams: frames split across chunks at awkward places, comments,
# multi-line data, and a connection that drops mid-job and must resume by Last-Event-ID.
STREAM = "parts => new ReadableStream({start(c) { for (const p of parts) \
c.enqueue(new TextEncoder().encode(p)); c.close(); }})"

SSE_PARSE = f"""async (parts) => {{
  const frames = [];
  for await (const f of sseFrames(({STREAM})(parts))) frames.push(f);
  return frames;
}}"""

# Stubs fetch(): each call answers the next body, then closes the stream.
SSE_RESUME = f"""async (bodies) => {{
  const sent = [];
  const realFetch = window.fetch;
  window.fetch = async (url, init) => {{
    sent.push({{auth: init.headers.Authorization, last: init.headers["Last-Event-ID"] ?? null}});
    return new Response(({STREAM})([bodies.shift()]), {{status: 200}});
  }};
  const events = [];
  try {{
    await followEvents("some-job", new AbortController().signal,
                       (kind, data, id) => events.push([kind, data, id]));
  }} finally {{
    window.fetch = realFetch;
  }}
  return {{sent, events}};
}}"""


def test_event_stream_reader(page: Any, service: Service) -> None:
    page.goto(f"{service.url}/")
    page.evaluate("key => sessionStorage.setItem('trainq.apiKey', key)", "k-123")
    parts = [
        "id: 1-0\r",  # a \r\n split across two chunks is one line end, not two
        '\nevent: step\ndata: {"step":',
        "1}\n\n",
        ": keep-alive\n\n",
        "id: 1-1\nevent: epoch\ndata: a\ndata:b\r\n\r\n",
    ]
    assert page.evaluate(SSE_PARSE, parts) == [
        {"id": "1-0", "event": "step", "data": '{"step":1}'},
        {"id": "1-1", "event": "epoch", "data": "a\nb"},
    ]
    first = 'retry: 10\nid: 1-0\nevent: step\ndata: {"step":1}\n\n'
    first += 'id: 2-0\nevent: step\ndata: {"step":2}\n\n'  # and the connection drops
    second = 'id: 3-0\nevent: step\ndata: {"step":3}\n\n'
    second += 'id: 3-3\nevent: status\ndata: {"status":"succeeded"}\n\n'
    out = page.evaluate(SSE_RESUME, [first, second])
    assert [s["last"] for s in out["sent"]] == [None, "2-0"]  # resumed after the drop
    assert {s["auth"] for s in out["sent"]} == {"Bearer k-123"}
    assert out["events"] == [
        ["step", {"step": 1}, "1-0"],
        ["step", {"step": 2}, "2-0"],
        ["step", {"step": 3}, "3-0"],
        ["status", {"status": "succeeded"}, "3-3"],
    ]
    assert not page.problems, page.problems


def test_page_and_static_files(service: Service) -> None:
    """The page needs no key; only the files in api/static/ are served, by exact name."""
    with httpx.Client(base_url=service.url, timeout=10) as http:
        page = http.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "default-src 'self'" in page.headers["content-security-policy"]
        js = http.get("/static/app.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        vendored = http.get("/static/vendor/uplot/uPlot.iife.min.js")  # a folder's file
        assert vendored.status_code == 200 and "javascript" in vendored.headers["content-type"]
        for path in [
            "/static/missing.js",
            "/static/..%2Froutes%2Fweb.py",
            "/static/%2e%2e/app.py",
            "/static/../app.py",
            "/static/",
            "/static/vendor/uplot/LICENSE",  # no known type
            "/static/vendor/..%2F..%2Froutes%2Fweb.py",
            "/static/vendor",
        ]:
            # Never served: 404 under /static/, or 401 where the client normalised the path
            # out of the public pages (it needs a key there before anything is looked up).
            assert http.get(path).status_code in (401, 404), path
        assert http.get("/jobs").status_code == 401  # the API itself still needs a key

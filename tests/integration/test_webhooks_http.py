"""/webhooks over HTTP, against the real API (uvicorn), a real RQ worker and real receivers on
loopback: a job that succeeds is delivered once, signed as Standard Webhooks verifiers
expect; a receiver's 500 brings the same webhook-id again; internal addresses are refused at
registration (127.0.0.1, the metadata address, [::1], a name that resolves to loopback) and
a redirect to one is not followed; another key's endpoint reads as missing; the bounds are
clear 4xx; an admin pauses and resumes delivery (over HTTP and with `trainq webhook`), and
/health, /metrics and the listing show how delivery goes. On SQLite and PostgreSQL.
Receivers listen on 127.0.0.2, the one address the service's TRAINQ_WEBHOOK_ALLOW_HOSTS
allows."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client.http import ApiError
from client.webhooks import Webhooks
from tests.cli_runs import run_trainq
from tests.service import RedisServer, Service, wait_until
from tests.webhook_receiver import Receiver, verify, verify_with_library

ALLOWED = "127.0.0.2"
ENV = {
    "TRAINQ_WEBHOOK_ALLOW_HOSTS": f"{ALLOWED}/32",
    "TRAINQ_WEBHOOK_MAX_ENDPOINTS_PER_KEY": "3",
}
QUICK_JOB = {"epochs": 1, "max_steps": 3, "export": ["torchscript"]}


@pytest.fixture(scope="module")
def svc(service_data_dir: Path, database_url: str, redis_server: RedisServer) -> Iterator[Service]:
    service = Service(
        data_dir=service_data_dir, database_url=database_url, redis=redis_server, extra_env=ENV
    )
    yield service.up(workers=1)
    service.stop()


@pytest.fixture
def rx() -> Iterator[Receiver]:
    receiver = Receiver(ALLOWED).start()
    yield receiver
    receiver.close()


MAX_TEST_EVENTS_WAITING = 20  # api.services.webhooks's


def hooks(svc: Service, key: str | None = None) -> Webhooks:
    return Webhooks(svc.client(key))


@pytest.fixture(autouse=True)
def _no_endpoints_left(svc: Service) -> Iterator[None]:
    """Each test starts with no endpoint of either key's (the bound is 3)."""
    yield
    for key in svc.keys:
        mine = hooks(svc, key)
        for e in mine.list():
            mine.remove(e["id"])


def log_of(h: Webhooks, endpoint_id: str) -> list[dict[str, Any]]:
    return list(h.deliveries(endpoint_id))


def delivered(h: Webhooks, endpoint_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        found = log_of(h, endpoint_id)
        return found[0] if found and found[0]["status"] == "delivered" else None

    return wait_until(done, 120, "a delivered webhook", interval=0.2)  # type: ignore[no-any-return]


def test_a_job_that_succeeds_is_delivered_once_signed(svc: Service, rx: Receiver) -> None:
    alice, bob = hooks(svc), hooks(svc, svc.keys[1])
    hook = alice.add(rx.url, ["job.succeeded", "job.failed"], "ci")
    other_type = alice.add(rx.url, ["job.canceled"])
    bobs = bob.add(rx.url, ["job.succeeded"])
    job = alice.client.submit(QUICK_JOB)
    done = delivered(alice, hook["id"])
    [got] = rx.received
    verify(hook["secret"], got)
    verify_with_library(hook["secret"], got)
    body = json.loads(got.body)
    assert body["type"] == "job.succeeded"
    assert body["data"]["job_id"] == job["id"]
    assert body["data"]["result"]["steps"] == 3
    assert done["event_id"] == got.webhook_id
    assert (done["attempts"], done["status_code"]) == (1, 200)
    assert done["latency_ms"] is not None
    assert alice.client.job(job["id"])["status"] == "succeeded"
    assert log_of(alice, other_type["id"]) == log_of(bob, bobs["id"]) == []


@pytest.mark.slow
def test_a_500_brings_the_same_webhook_id_again(svc: Service) -> None:
    rx = Receiver(ALLOWED, lambda n: (500 if n == 0 else 200, {}, b"not now")).start()
    try:
        h = hooks(svc)
        hook = h.add(rx.url, ["job.failed"])
        event_id = h.test(hook["id"])["event_id"]
        done = delivered(h, hook["id"])
        first, second = rx.received
    finally:
        rx.close()
    assert first.webhook_id == second.webhook_id == event_id
    for got in (first, second):
        verify(hook["secret"], got)
    assert (done["attempts"], done["status_code"], done["type"]) == (2, 200, "webhook.test")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:9/hook",
        "http://localhost:9/hook",
        "http://[::ffff:127.0.0.1]:9/hook",
        "http://10.0.0.1/hook",
        "http://100.64.0.1/hook",
        "http://0.0.0.0:9/hook",
    ],
)
def test_an_internal_address_is_refused_at_registration(svc: Service, url: str) -> None:
    h = hooks(svc)
    with pytest.raises(ApiError) as refused:
        h.add(url, ["job.failed"])
    assert refused.value.status == 422
    [problem] = refused.value.detail
    assert problem["loc"] == ["body", "url"] and problem["type"] == "unsafe_url"
    assert "public addresses" in problem["msg"]
    assert h.list() == []


def test_a_redirect_to_loopback_is_not_followed(svc: Service) -> None:
    target = Receiver("127.0.0.1").start()
    rx = Receiver(ALLOWED, lambda n: (302, {"location": target.url}, b"")).start()
    try:
        h = hooks(svc)
        hook = h.add(rx.url, ["job.failed"])
        h.test(hook["id"])
        wait_until(lambda: log_of(h, hook["id"])[0]["status_code"] == 302, 60, "the 302")
        [entry] = log_of(h, hook["id"])
        rx.wait_for(1)
    finally:
        rx.close()
        target.close()
    assert entry["status"] == "pending" and "redirect" in entry["last_error"]
    assert target.received == []


def test_another_keys_endpoint_reads_as_missing(svc: Service) -> None:
    alice, bob = hooks(svc), hooks(svc, svc.keys[1])
    hook = alice.add(f"http://{ALLOWED}:9/hook", ["job.failed"])
    for call in (
        lambda: bob.get(hook["id"]),
        lambda: bob.change(hook["id"], enabled=False),
        lambda: bob.remove(hook["id"]),
        lambda: bob.test(hook["id"]),
        lambda: list(bob.deliveries(hook["id"])),
    ):
        with pytest.raises(ApiError) as missing:
            call()
        assert missing.value.status == 404
    assert bob.list() == []
    admin = Webhooks(svc.client(svc.admin_key))
    assert hook["id"] in [e["id"] for e in admin.list()]
    assert "secret" not in alice.get(hook["id"]) and alice.get(hook["id"])["enabled"]


def test_bounds_and_bad_input_are_clear_4xx(svc: Service) -> None:
    h = hooks(svc)
    url = f"http://{ALLOWED}:9/hook"
    made = [h.add(url, ["job.failed"]) for _ in range(3)]
    with pytest.raises(ApiError) as over:
        h.add(url, ["job.failed"])
    assert over.value.status == 429
    assert over.value.body["limit"] == "webhook_max_endpoints_per_key"
    bad: list[tuple[str, Any]] = [
        ("post", {"url": url + "x" * 2048, "events": ["job.failed"]}),
        ("post", {"url": "ftp://example.com/", "events": ["job.failed"]}),
        ("post", {"url": url, "events": ["job.exploded"]}),
        ("post", {"url": url, "events": []}),
        ("post", {"url": url, "events": ["job.failed"], "secret": "mine"}),
        ("patch", {"url": None}),
        ("patch", {"events": None}),
        ("patch", {"url": "http://127.0.0.1/"}),
    ]
    for method, body in bad:
        path = "/webhooks" if method == "post" else f"/webhooks/{made[0]['id']}"
        answer = h.client.http.request(method.upper(), path, json=body)
        assert answer.status_code == 422, (body, answer.text)


def test_a_disabled_endpoint_takes_no_test_until_enabled(svc: Service) -> None:
    h = hooks(svc)
    hook = h.add(f"http://{ALLOWED}:9/hook", ["job.failed"])
    assert h.change(hook["id"], enabled=False)["enabled"] is False
    with pytest.raises(ApiError) as refused:
        h.test(hook["id"])
    assert refused.value.status == 409
    h.change(hook["id"], enabled=True)
    assert h.test(hook["id"])["event_id"].startswith("evt_")


def test_test_events_waiting_for_one_endpoint_are_bounded(svc: Service) -> None:
    """An endpoint whose receiver is away (port 9 refuses) holds its test events: past
    MAX_TEST_EVENTS_WAITING of them another is a 429, not a row more to retry."""
    h = hooks(svc)
    hook = h.add(f"http://{ALLOWED}:9/hook", ["job.failed"])
    for _ in range(MAX_TEST_EVENTS_WAITING):
        h.test(hook["id"])
    with pytest.raises(ApiError) as refused:
        h.test(hook["id"])
    assert refused.value.status == 429, refused.value
    assert refused.value.body["limit"] == "test events waiting for one endpoint"


def admin(svc: Service) -> Webhooks:
    return Webhooks(svc.client(svc.admin_key))


def health(svc: Service) -> dict[str, Any]:
    answer = svc.client().http.get("/health")
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def metrics(svc: Service) -> dict[str, float]:
    """The webhook series of /metrics, by name and labels as the text spells them."""
    text = svc.client().http.get("/metrics").text
    found = {}
    for line in text.splitlines():
        if line.startswith("trainq_webhook_"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def test_health_shows_the_dispatcher_alive(svc: Service) -> None:
    seen = wait_until(lambda: health(svc)["webhooks"], 30, "/health's webhooks")
    assert (seen["status"], seen["paused"]) == ("ok", False)
    assert 0 <= seen["since_dispatch_s"] < 30


def test_an_admin_pauses_delivery_and_every_event_waits_for_resume(
    svc: Service, rx: Receiver
) -> None:
    h = hooks(svc)
    with pytest.raises(ApiError) as refused:
        h.pause("not mine to pause")
    assert refused.value.status == 403
    try:
        paused = admin(svc).pause("a restored copy")
        assert (paused["status"], paused["paused"]) == ("paused", True)
        assert (paused["paused_by"], paused["reason"]) != (None, None)
        shown = h.listing()["delivery"]
        assert shown["paused"] and shown["paused_at"] and shown["reason"] is None  # admins'
        assert wait_until(lambda: health(svc)["webhooks"]["status"] == "paused", 10, "paused")
        assert metrics(svc)["trainq_webhook_delivery_paused"] == 1
        hook = h.add(rx.url, ["job.failed"])
        event_id = h.test(hook["id"])["event_id"]
        time.sleep(1.5)  # three of the dispatcher's polls
        assert rx.received == []
        assert [d["status"] for d in log_of(h, hook["id"])] == ["pending"]
    finally:
        resumed = admin(svc).resume()
    assert resumed["paused"] is False
    [got] = rx.wait_for(1)
    assert got.webhook_id == event_id
    assert delivered(h, hook["id"])["attempts"] == 1


def test_trainq_webhook_pause_and_resume(
    svc: Service, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"TRAINQ_API_URL": svc.url, "TRAINQ_API_KEY": svc.admin_key}
    try:
        ran = run_trainq(capsys, monkeypatch, ["webhook", "pause", "--reason", "restore"], env)
        assert ran.returncode == 0, ran.stderr
        assert "webhook delivery is paused since" in ran.stdout and "(restore)" in ran.stdout
        listed = run_trainq(capsys, monkeypatch, ["webhook", "ls"], env)
        assert "webhook delivery is paused" in listed.stderr
    finally:
        ran = run_trainq(capsys, monkeypatch, ["webhook", "resume"], env)
    assert ran.returncode == 0, ran.stderr
    assert "webhook delivery is on" in ran.stdout
    user = {**env, "TRAINQ_API_KEY": svc.keys[0]}
    refused = run_trainq(capsys, monkeypatch, ["webhook", "pause"], user)
    assert refused.returncode != 0 and "admin" in refused.stderr


def test_metrics_show_pending_held_failing_and_attempts_by_outcome(svc: Service) -> None:
    """A receiver that answers 410 Gone: its endpoint is marked failing at once, and the
    delivery is held; /metrics counts each."""
    rx = Receiver(ALLOWED, lambda n: (410, {}, b"gone")).start()
    try:
        before = metrics(svc)
        h = hooks(svc)
        hook = h.add(rx.url, ["job.failed"])
        h.test(hook["id"])
        wait_until(lambda: h.get(hook["id"])["failing_since"], 60, "the endpoint failing")
        after = metrics(svc)
    finally:
        rx.close()
    rejected = 'trainq_webhook_attempts_total{outcome="rejected"}'
    assert after[rejected] == before.get(rejected, 0) + 1
    assert (
        after["trainq_webhook_endpoints_failing"] == before["trainq_webhook_endpoints_failing"] + 1
    )
    assert after["trainq_webhook_deliveries_held"] >= 1
    assert after["trainq_webhook_deliveries_pending"] >= after["trainq_webhook_deliveries_held"]
    assert after["trainq_webhook_oldest_pending_seconds"] > 0
    assert 'trainq_webhook_attempts_total{outcome="delivered"}' in after

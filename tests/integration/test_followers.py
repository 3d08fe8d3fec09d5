"""Followers are bounded: event streams open at once per key and per API process (429
past either), and a follower whose client does not keep up is sent `lagging` and dropped,
then resumes from its Last-Event-ID with no gap. Real API, redis-server and HTTP; the
stream is written as a worker writes it (core.stream), at a rate no CPU trainer reaches."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.stream import publish_status, step_entries, write
from core.train import StepMetrics
from tests.service import RedisServer, Service, wait_until

PER_KEY, PER_PROCESS, MAX_LAG = 2, 3, 500
FOLLOW_BOUND_S = 120.0  # a whole read, however slow the machine
FLOOD = 40_000  # entries: far more than a socket's buffers hold (a few MB) and MAX_LAG


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, service_data_dir: Path) -> Iterator[Service]:
    """An API with small limits, and no worker: jobs stay queued, their streams ours."""
    root = tmp_path_factory.mktemp("followers")
    redis = RedisServer(root / "redis", appendfsync="everysec")
    redis.start()
    service = Service(
        data_dir=service_data_dir,
        database_url=f"sqlite:///{root / 'trainq.db'}",
        redis=redis,
        log_dir=root,
        extra_env={
            "TRAINQ_SSE_MAX_PER_KEY": str(PER_KEY),
            "TRAINQ_SSE_MAX_PER_PROCESS": str(PER_PROCESS),
            "TRAINQ_SSE_MAX_LAG": str(MAX_LAG),
        },
    )
    service.migrate()
    service.start_api()
    yield service
    service.stop()
    redis.kill()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def gauge(svc: Service, name: str) -> float:
    text = httpx.get(f"{svc.url}/metrics", headers=auth(svc.admin_key)).text
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, name
    return float(match[1])


def open_stream(stack: ExitStack, http: httpx.Client, url: str, key: str) -> httpx.Response:
    return stack.enter_context(http.stream("GET", url, headers=auth(key)))


def refusal(http: httpx.Client, url: str, key: str) -> tuple[int, dict[str, Any], str]:
    """Status, body and Retry-After of a stream the API should refuse (a stream it
    accepts is closed at once, its status returned with no body)."""
    with http.stream("GET", url, headers=auth(key)) as resp:
        if resp.status_code != 429:
            return resp.status_code, {}, ""
        resp.read()
        return resp.status_code, resp.json(), resp.headers["retry-after"]


def test_streams_past_the_per_key_and_per_process_limits_are_429(svc: Service) -> None:
    alice, bob = svc.keys
    job = svc.client().submit({"epochs": 1})["id"]
    url = f"{svc.url}/jobs/{job}/events"
    with httpx.Client(timeout=30) as http, ExitStack() as stack:
        held = [open_stream(stack, http, url, alice) for _ in range(PER_KEY)]
        assert [r.status_code for r in held] == [200] * PER_KEY
        status, body, retry_after = refusal(http, url, alice)
        assert status == 429 and retry_after
        assert body["limit"] == "sse_max_per_key" and body["allowed"] == PER_KEY
        assert f"{PER_KEY} event streams" in body["detail"]
        # Another key still may, up to the process's limit.
        admin_job = svc.client(svc.admin_key).submit({"epochs": 1})["id"]
        assert open_stream(stack, http, url, bob).status_code == 404  # not bob's: no slot
        other = f"{svc.url}/jobs/{admin_job}/events"
        assert open_stream(stack, http, other, svc.admin_key).status_code == 200
        status, body, _ = refusal(http, other, svc.admin_key)
        assert status == 429 and body["limit"] == "sse_max_per_process"
        assert gauge(svc, "trainq_sse_followers") == PER_PROCESS
        held[0].close()  # a stream that ends frees its place
        wait_until(lambda: gauge(svc, "trainq_sse_followers") == PER_PROCESS - 1, 10, "a slot")
        assert open_stream(stack, http, url, alice).status_code == 200
    wait_until(lambda: gauge(svc, "trainq_sse_followers") == 0, 10, "every slot back")


def point(step: int) -> StepMetrics:
    return StepMetrics(step, 1, 2.302585 / step, 0.001, 12345.6, 0, 0, 0, 1.7e9 + step)


def events_of(lines: Iterator[str], until: str | None = None) -> Iterator[dict[str, Any]]:
    """SSE events from `lines` until the stream ends (or an event of kind `until`); fails
    if it is still open after FOLLOW_BOUND_S (keep-alives do not count)."""
    deadline = time.monotonic() + FOLLOW_BOUND_S
    event: dict[str, str] = {}
    for line in lines:
        assert time.monotonic() < deadline, f"the stream is still open: {event}"
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")
            continue
        if event:
            yield {**event, "data": json.loads(event["data"])}
            if event["event"] == until:
                return
            event = {}


@pytest.mark.slow
def test_a_client_that_stops_reading_is_sent_lagging_and_resumes_with_no_gap(
    svc: Service,
) -> None:
    key = svc.keys[0]
    job = svc.client().submit({"epochs": 1})["id"]
    r = svc.redis.client()
    write(r, job, 1, step_entries([point(1)]))
    url = f"{svc.url}/jobs/{job}/events"
    # A small receive buffer: the server's socket fills soon after the client stops reading.
    tiny = httpx.HTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)])
    lagged_before = gauge(svc, "trainq_sse_lagging_total")
    with (
        httpx.Client(transport=tiny, timeout=60) as http,
        http.stream("GET", url, headers=auth(key)) as resp,
    ):
        lines = resp.iter_lines()
        first = next(events_of(lines))
        assert first["id"] == "1-0"
        # A keep-alive: the follower has read what the stream held and follows it live.
        assert next(line for line in lines if line) == ": keep-alive"
        # The client stops reading while its job races ahead.
        for start in range(2, FLOOD + 2, 1000):
            write(r, job, 1, step_entries([point(s) for s in range(start, start + 1000)]))
        wait_until(
            lambda: gauge(svc, "trainq_sse_lagging_total") > lagged_before,
            60,
            "the API to let the follower go",
            0.2,
        )
        got = [first, *events_of(lines)]  # what was on its way, then `lagging`; then closed
    lagging = got[-1]
    assert lagging["event"] == "lagging", got[-2:]
    steps = [e["data"]["step"] for e in got if e["event"] == "step"]
    assert steps == list(range(1, len(steps) + 1))
    assert len(steps) < FLOOD  # it was dropped, not served to the end
    assert lagging["id"] == lagging["data"]["last_id"] == f"{steps[-1]}-0"
    wait_until(lambda: gauge(svc, "trainq_sse_followers") == 0, 10, "its slot back")

    publish_status(r, job, FLOOD + 1, {"status": "succeeded"}, attempt=1)
    r.close()
    headers = {**auth(key), "Last-Event-ID": lagging["id"]}
    with httpx.stream("GET", url, headers=headers, timeout=60) as resp:
        rest = list(events_of(resp.iter_lines()))
    assert rest[-1]["event"] == "status" and rest[-1]["data"]["status"] == "succeeded"
    resumed = [e["data"]["step"] for e in rest if e["event"] == "step"]
    assert steps + resumed == list(range(1, FLOOD + 2))

"""Redis stops answering (SIGSTOP: its sockets stay open, nothing comes back) while a client
follows a job's events: the stream ends cleanly, with a `retry:` hint, within Redis's read
timeout; the API logs no traceback; the client that reconnects with Last-Event-ID once
Redis is back misses no event."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.db import Database
from core.redis_client import READ_TIMEOUT_S
from core.store import claim_job
from core.stream import publish_status, publish_steps
from core.train import StepMetrics
from tests.service import RedisServer, Service, wait_until

pytestmark = pytest.mark.slow
SPEC = {"epochs": 1, "batch_size": 128}
# The API's longest Redis command (XREAD BLOCK 5 s) plus its read timeout, and some slack:
# a stream still open this long after the stall was never ended by it.
ENDED_WITHIN_S = 5 + READ_TIMEOUT_S + 10


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    (tmp_path / "data").mkdir()
    service = Service(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'trainq.db'}",
        redis=redis,
        log_dir=tmp_path,
    )
    try:
        service.migrate()
        service.start_api()
        yield service
    finally:
        service.stop()
        if redis.proc is not None:
            os.kill(redis.proc.pid, signal.SIGCONT)
        redis.kill()


class Follower:
    """One client's stream of a job's events, read in a thread: the events, every line,
    and how the stream ended (None: closed by the server, cleanly)."""

    def __init__(self, svc: Service, job_id: str, last_event_id: str | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.error: BaseException | None = None
        headers = {"Authorization": f"Bearer {svc.keys[0]}"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        url = f"{svc.url}/jobs/{job_id}/events"
        self.thread = threading.Thread(target=self._read, args=(url, headers), daemon=True)
        self.thread.start()

    def _read(self, url: str, headers: dict[str, str]) -> None:
        event: dict[str, str] = {}
        try:
            with httpx.stream("GET", url, headers=headers, timeout=ENDED_WITHIN_S) as resp:
                assert resp.status_code == 200, resp.read()
                for line in resp.iter_lines():
                    self.lines.append(line)
                    if line and not line.startswith(":"):
                        name, _, value = line.partition(":")
                        event[name] = value.removeprefix(" ")
                    elif event.get("data"):
                        self.events.append({**event, "data": json.loads(event["data"])})
                        event = {}
        except BaseException as e:
            self.error = e

    def steps(self) -> list[int]:
        return [e["data"]["step"] for e in self.events if e["event"] == "step"]

    def ended(self) -> bool:
        self.thread.join(ENDED_WITHIN_S)
        assert not self.thread.is_alive(), f"the stream is still open: {self.lines[-5:]}"
        return True


def points(first: int, last: int) -> list[StepMetrics]:
    return [StepMetrics(n, 1, 0.5, 1e-3, 100.0, 0, 0, 0, 0.0) for n in range(first, last + 1)]


def test_a_follower_gets_a_clean_end_and_a_retry_hint_when_redis_stalls(svc: Service) -> None:
    job_id = str(svc.client().submit(SPEC)["id"])  # no worker: this test writes as one
    db = Database(svc.database_url)
    try:
        with db.writer() as s:
            assert claim_job(s, job_id=job_id, worker="w1", device="cpu") is not None
    finally:
        db.dispose()
    r = svc.redis.client()
    running = {"type": "status", "status": "running"}
    publish_status(r, job_id, 0, running, attempt=1)
    publish_steps(r, job_id, points(1, 3), 1000, attempt=1)
    first = Follower(svc, job_id)
    wait_until(lambda: first.steps() == [1, 2, 3], 30, "the first steps", 0.05)
    assert svc.redis.proc is not None
    os.kill(svc.redis.proc.pid, signal.SIGSTOP)
    try:
        assert first.ended()
    finally:
        os.kill(svc.redis.proc.pid, signal.SIGCONT)
    assert first.error is None, repr(first.error)
    assert "retry: 5000" in first.lines, first.lines[-5:]
    log = svc.logs(tail=None)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]

    publish_steps(r, job_id, points(4, 6), 1000, attempt=1)
    publish_status(r, job_id, 6, {"type": "status", "status": "succeeded"}, attempt=1)
    again = Follower(svc, job_id, last_event_id=first.events[-1]["id"])
    assert again.ended() and again.error is None, repr(again.error)
    assert first.steps() + again.steps() == [1, 2, 3, 4, 5, 6]
    assert again.events[-1]["data"]["status"] == "succeeded"

"""The real parts the state machine drives (a database, a redis-server, the API) and what
it reads back from them once a job ended."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
from redis import Redis

from core.config import Settings
from core.db import Database
from worker.entry_checks import entry_is_live

SSE_READ_TIMEOUT_S = 15.0  # above the API's idle block, so its database fallback may answer


@dataclass
class World:
    """The real parts one module shares: a database, a redis-server and the API."""

    db: Database
    r: Redis
    http: httpx.Client
    queue: str
    beating: Settings  # a reconcile pass that finds the attempt beating
    silent: Settings  # ... and one that finds it silent past the heartbeat timeout


def assert_every_key_expires(r: Redis, job_id: str) -> None:
    for key in r.scan_iter(match=f"*{job_id}*", count=1000):
        name = key.decode()
        # RQ's hash of an entry still waiting in the queue expires once a worker picks
        # it up (and skips it: the job ended); no worker runs here.
        waiting = name.startswith("rq:job:") and entry_is_live(r, name[7:])
        assert waiting or r.ttl(key) > 0, f"{name} never expires"


def metrics_pages(http: httpx.Client, job_id: str) -> list[tuple[int, int]]:
    """/metrics, page by page (pages of 4 cross the database/stream boundary): each step
    and the attempt that wrote it (its loss)."""
    got: list[tuple[int, int]] = []
    after = 0
    while True:
        resp = http.get(f"/jobs/{job_id}/metrics?after={after}&limit=4")
        assert resp.status_code == 200, resp.text
        page = resp.json()
        if not page["items"]:
            return got
        got += [(p["step"], int(p["loss"])) for p in page["items"]]
        after = page["next"]


def followed_events(http: httpx.Client, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The whole event stream of an ended job, as (kind, data); the server must close it."""
    events: list[tuple[str, dict[str, Any]]] = []
    kind = ""
    timeout = httpx.Timeout(10, read=SSE_READ_TIMEOUT_S)
    with http.stream("GET", f"/jobs/{job_id}/events", timeout=timeout) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, json.loads(line.removeprefix("data: "))))
    return events

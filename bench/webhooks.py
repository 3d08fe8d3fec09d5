"""Event-to-delivery latency of signed webhooks, measured on real parts (redis-server, SQLite,
the API under uvicorn with its dispatcher, `trainq worker` processes on the CPU, and a
receiver on loopback that TRAINQ_WEBHOOK_ALLOW_HOSTS allows). From the event's own timestamp
(written in the transaction that ended the job) to the moment its body reached the receiver.

Two phases of the same run: the baseline, test events (POST /webhooks/{id}/test) sent to a
quiet service; then under load: jobs ending on the workers (each a `job.succeeded` event),
test events, and GET /jobs and GET /jobs/{id} requests hitting the API from other threads.
Prints one JSON object: p50/p99/max in milliseconds for each phase.

    python -m bench.webhooks [--jobs 20] [--tests 40] [--workers 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import threading
import time
from typing import Any

import httpx

from client.http import Client
from client.webhooks import Webhooks
from core.webhooks.dispatcher import Pace
from tests.service import Service, scratch_service, wait_until
from tests.webhook_receiver import Received, Receiver, verify

SPEC = {"epochs": 1, "max_steps": 3, "export": ["torchscript"]}
TEST_GAP_S = 0.25  # between test events: each measured on its own, not as a burst
READERS = 4  # threads that keep GET requests on the API during the load phase


def latency_ms(got: Received) -> float:
    stamp = dt.datetime.fromisoformat(json.loads(got.body)["timestamp"]).timestamp()
    return (got.at - stamp) * 1000


def figures(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered
    return {
        "events": len(ordered),
        "p50_ms": round(statistics.median(ordered), 1),
        "p99_ms": round(q[98] if len(q) > 98 else ordered[-1], 1),
        "max_ms": round(ordered[-1], 1),
    }


def tests(h: Webhooks, endpoint_id: str, n: int) -> None:
    for _ in range(n):
        h.test(endpoint_id)
        time.sleep(TEST_GAP_S)


def readers(svc: Service, stop: threading.Event, counts: list[int]) -> list[threading.Thread]:
    """Threads that send GET /jobs and GET /jobs/{id} until `stop`; requests into `counts`."""

    def read() -> None:
        with httpx.Client(base_url=svc.url, headers=auth(svc), timeout=30) as http:
            while not stop.is_set():
                page = http.get("/jobs", params={"limit": 20}).json()
                for job in page.get("items", [])[:3]:
                    http.get(f"/jobs/{job['id']}")
                counts.append(1 + min(3, len(page.get("items", []))))

    return [threading.Thread(target=read, daemon=True) for _ in range(READERS)]


def auth(svc: Service) -> dict[str, str]:
    return {"Authorization": f"Bearer {svc.keys[0]}"}


def baseline(svc: Service, rx: Receiver, secret: str, endpoint_id: str, n: int) -> list[float]:
    h = Webhooks(svc.client())
    tests(h, endpoint_id, n)
    got = rx.wait_for(n, timeout=120)
    for r in got:
        verify(secret, r)
    return [latency_ms(r) for r in got]


def under_load(
    svc: Service, rx: Receiver, endpoint_id: str, jobs: int, n: int
) -> tuple[list[float], list[float], int, float]:
    c: Client = svc.client()
    before = len(rx.received)
    stop, counts = threading.Event(), []
    load = readers(svc, stop, counts)
    started = time.monotonic()
    for t in load:
        t.start()
    for _ in range(jobs):
        c.submit(SPEC)
    tests(Webhooks(svc.client()), endpoint_id, n)
    got = rx.wait_for(before + jobs + n, timeout=900)[before:]
    stop.set()
    for t in load:
        t.join(60)
    elapsed = time.monotonic() - started
    ended = [latency_ms(r) for r in got if json.loads(r.body)["type"] == "job.succeeded"]
    tested = [latency_ms(r) for r in got if json.loads(r.body)["type"] == "webhook.test"]
    return ended, tested, sum(counts), elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=20, help="jobs that end under load")
    p.add_argument("--tests", type=int, default=40, help="test events in each phase")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    env = {"TRAINQ_WEBHOOK_ALLOW_HOSTS": "127.0.0.1/32"}
    rx = Receiver().start()
    try:
        with scratch_service(workers=args.workers, env=env) as svc:
            h = Webhooks(svc.client())
            hook = h.add(rx.url, ["job.succeeded"])
            quiet = baseline(svc, rx, hook["secret"], hook["id"], args.tests)
            ended, tested, requests, elapsed = under_load(
                svc, rx, hook["id"], args.jobs, args.tests
            )
            wait_until(lambda: len(rx.received) >= 2 * args.tests + args.jobs, 60, "all")
    finally:
        rx.close()
    report = {
        "benchmark": "webhooks",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "database": "sqlite",
        "dispatcher_poll_s": Pace().poll_s,
        "workers": args.workers,
        "baseline_quiet_test_events": figures(quiet),
        "under_load": {
            "job_succeeded_events": figures(ended),
            "test_events": figures(tested),
            "api_requests": requests,
            "api_requests_per_s": round(requests / elapsed, 1),
            "seconds": round(elapsed, 1),
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

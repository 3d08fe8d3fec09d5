"""API under load, on loopback: uvicorn with one process (real Redis, SQLite), and a load
generator in a second process (bench/loadgen.py), bounded in requests and time.

1. POST /jobs and GET /jobs/{id}/metrics with 50 clients: open loop at --rate requests/s
   (the latency at that load: the targets are p99 <= 25 ms at 500 req/s), and closed loop
   (the most the process serves; by Little's law its latency is clients / throughput).
   /health closed loop as a reference. The metrics page read is a finished job's first
   100 steps; an empty page of a queued job is also measured.
2. SSE fan-out: 100 clients follow one running job from before it starts; every client
   must see every step; the job's training images/s against the same job with no
   followers, in alternating rounds on the same worker.

Prints one JSON object.    python -m bench.api_load [--rate 500] [--clients 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import update

from bench.loadgen import encode_request
from core.db import Database, Job
from core.queue import job_queue
from core.spec import JobStatus
from tests.service import Service, scratch_service, wait_until

SMALL = {"epochs": 1, "max_steps": 1}


def load(
    svc: Service, method: str, path: str, *, n: int, clients: int, rate: float | None = None
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.loadgen", svc.url, method, path, "--key", svc.keys[0]]
    cmd += ["-n", str(n), "-c", str(clients)]
    if method == "POST":
        cmd += ["--body", json.dumps(SMALL)]
    if rate is not None:
        cmd += ["--rate", str(rate)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


async def _follow(url: str, key: str, job_id: str, ready: asyncio.Event, n: list[int]) -> list[int]:
    """A lean SSE follower (raw socket): the step ids it saw, in order."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(encode_request("GET", parts.netloc, f"/jobs/{job_id}/events", key, None))
    await reader.readuntil(b"\r\n\r\n")
    n[0] += 1
    if n[0] == n[1]:
        ready.set()
    seen: list[int] = []
    buf = b""
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return seen
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.startswith(b"id: ") and line.endswith(b"-0"):
                    seen.append(int(line[4:-2]))
                elif line.startswith(b"id: ") and line.endswith(b"-3"):
                    return seen  # the job ended
    finally:
        writer.close()


def fan_out(svc: Service, clients: int, rounds: int, steps: int) -> dict[str, Any]:
    c = svc.client()
    spec = {"epochs": 1, "batch_size": 64, "max_steps": steps}
    alone: list[float] = []
    followed: list[float] = []
    complete = True

    for _ in range(rounds):
        job = c.submit(spec)
        alone.append(_finished(c, job["id"])["result"]["images_per_second"])

        async def run() -> list[list[int]]:
            # A short job holds the worker while the followers connect to the next one.
            c.submit({**spec, "max_steps": 20})
            job = c.submit(spec)
            ready = asyncio.Event()
            count = [0, clients]
            tasks = [
                asyncio.create_task(_follow(svc.url, svc.keys[0], job["id"], ready, count))
                for _ in range(clients)
            ]
            await asyncio.wait_for(ready.wait(), 60)
            seen = await asyncio.wait_for(asyncio.gather(*tasks), 300)
            done = _finished(c, job["id"])
            followed.append(done["result"]["images_per_second"])
            return [s == list(range(1, done["result"]["steps"] + 1)) for s in seen]

        complete &= all(asyncio.run(run()))

    base, with_clients = statistics.median(alone), statistics.median(followed)
    return {
        "clients": clients,
        "steps_per_job": steps,
        "rounds": rounds,
        "every_client_saw_every_step": complete,
        "images_per_second_alone": [round(x) for x in alone],
        "images_per_second_followed": [round(x) for x in followed],
        "slowdown_fraction": round(1 - with_clients / base, 4),
    }


def _finished(c: Any, job_id: str) -> dict[str, Any]:
    wait_until(lambda: c.job(job_id)["status"] == "succeeded", 300, "the job", 0.2)
    return dict(c.job(job_id))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rate", type=float, default=500)
    p.add_argument("--sse-clients", type=int, default=100)
    p.add_argument("--sse-rounds", type=int, default=2)
    p.add_argument("--sse-steps", type=int, default=300)
    args = p.parse_args()
    with scratch_service(workers=1) as svc:
        c = svc.client()
        finished = c.submit({"epochs": 1, "max_steps": 100})
        _finished(c, finished["id"])
        svc.stop_workers()  # the load tests run with nothing else on the machine
        queued = c.submit(SMALL)
        n, k = args.requests, args.clients
        page = f"/jobs/{finished['id']}/metrics?limit=100"
        empty = f"/jobs/{queued['id']}/metrics"
        results: dict[str, Any] = {
            "post_jobs_at_rate": load(svc, "POST", "/jobs", n=n, clients=k, rate=args.rate),
            "get_metrics_at_rate": load(svc, "GET", page, n=n, clients=k, rate=args.rate),
            "get_empty_metrics_at_rate": load(svc, "GET", empty, n=n, clients=k, rate=args.rate),
            "post_jobs_closed_loop": load(svc, "POST", "/jobs", n=n, clients=k),
            "get_metrics_closed_loop": load(svc, "GET", page, n=n, clients=k),
            "health_closed_loop": load(svc, "GET", "/health", n=n, clients=k),
        }
        # The load's thousands of jobs, out of the fan-out's way: canceled in one statement
        # (the API would take one request each) and their queue entries dropped.
        with Database(svc.database_url).writer() as s:
            s.execute(update(Job).where(Job.status == JobStatus.queued).values(status="canceled"))
        job_queue(svc.redis.client(), svc.queue).empty()
        svc.start_worker()
        svc.wait_for_workers(1)
        time.sleep(1)
        results["sse_fan_out"] = fan_out(svc, args.sse_clients, args.sse_rounds, args.sse_steps)
    print(json.dumps({"benchmark": "api_load", "uvicorn_processes": 1, **results}, indent=2))


if __name__ == "__main__":
    main()

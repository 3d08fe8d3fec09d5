"""API under load, on loopback: uvicorn with one process (real Redis, SQLite), and a load
generator in a second process (httpx, asyncio), bounded in requests and time.

1. POST /jobs and GET /jobs/{id}/metrics at 50 concurrent clients: p50/p99 latency and
   requests/s (a GET of /health first, as a baseline for the framework's own cost).
2. SSE fan-out: 100 clients follow one running job; every client must see every step; the
   job's images/s against the same job with no clients.

Prints one JSON object.    python -m bench.api_load [--requests 2000] [--clients 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from typing import Any

import httpx

from core.queue import job_queue
from tests.service import Service, scratch_service, wait_until

LOAD = r"""
import asyncio, json, sys, time, httpx
url, key, path, method, n, clients, budget_s = sys.argv[1:8]
n, clients, budget_s = int(n), int(clients), float(budget_s)
body = {"epochs": 1, "max_steps": 1}

async def main():
    lat, codes = [], {}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer " + key},
                                 limits=limits, timeout=30) as c:
        left = n
        deadline = time.monotonic() + budget_s
        async def one():
            nonlocal left
            while left > 0 and time.monotonic() < deadline:
                left -= 1
                t = time.perf_counter()
                r = await (c.post(path, json=body) if method == "POST" else c.get(path))
                lat.append(time.perf_counter() - t)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
        start = time.perf_counter()
        await asyncio.gather(*[one() for _ in range(clients)])
        wall = time.perf_counter() - start
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000
    print(json.dumps({"requests": len(lat), "requests_per_second": len(lat) / wall,
                      "p50_ms": q(0.5), "p99_ms": q(0.99), "status_codes": codes}))
asyncio.run(main())
"""


def load(svc: Service, method: str, path: str, n: int, clients: int) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD,
            svc.url,
            svc.keys[0],
            path,
            method,
            str(n),
            str(clients),
            "60",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


async def _follow(url: str, key: str, job_id: str, seen: list[int]) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx.AsyncClient(base_url=url, headers=headers, timeout=None) as c,
        c.stream("GET", f"/jobs/{job_id}/events") as resp,
    ):
        event = ""
        async for line in resp.aiter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "step":
                seen.append(json.loads(line[5:])["step"])
            elif line.startswith("data:") and event == "status":
                ended = json.loads(line[5:])["status"] in ("succeeded", "failed", "canceled")
                if ended:
                    return


def fan_out(svc: Service, clients: int) -> dict[str, Any]:
    c = svc.client()
    spec = {"epochs": 1, "batch_size": 64, "max_steps": 60}
    alone = c.submit(spec)
    wait_until(lambda: c.job(alone["id"])["status"] == "succeeded", 120, "job", 0.2)
    followed = c.submit(spec)
    seen: list[list[int]] = [[] for _ in range(clients)]

    async def run() -> None:
        await asyncio.gather(*[_follow(svc.url, svc.keys[0], followed["id"], s) for s in seen])

    asyncio.run(asyncio.wait_for(run(), timeout=180))
    done = c.job(followed["id"])
    base = c.job(alone["id"])["result"]["images_per_second"]
    steps = done["result"]["steps"]
    return {
        "clients": clients,
        "every_client_saw_every_step": all(s == list(range(1, steps + 1)) for s in seen),
        "images_per_second_alone": base,
        "images_per_second_with_clients": done["result"]["images_per_second"],
        "slowdown_fraction": 1 - done["result"]["images_per_second"] / base,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--sse-clients", type=int, default=100)
    args = p.parse_args()
    with scratch_service(workers=0) as svc:
        c = svc.client()
        job = c.submit({"epochs": 1, "max_steps": 1})
        results: dict[str, Any] = {
            "health": load(svc, "GET", "/health", args.requests, args.clients),
            "post_jobs": load(svc, "POST", "/jobs", args.requests, args.clients),
            "get_metrics": load(
                svc, "GET", f"/jobs/{job['id']}/metrics", args.requests, args.clients
            ),
        }
        for queued in c.jobs(status="queued"):  # the load's jobs: out of the fan-out's way
            c.cancel(queued["id"])
        job_queue(svc.redis.client(), svc.queue).empty()  # and their queue entries
        svc.start_worker()
        svc.wait_for_workers(1)
        results["sse_fan_out"] = fan_out(svc, args.sse_clients)
    print(json.dumps({"benchmark": "api_load", "uvicorn_processes": 1, **results}, indent=2))


if __name__ == "__main__":
    main()

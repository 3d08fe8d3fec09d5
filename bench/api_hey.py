"""The API under a real load generator: `hey` (Debian's and Ubuntu's package `hey`) drives one
uvicorn process (a redis-server and SQLite behind it, no worker running) at a fixed rate,
and every request's latency comes back in hey's CSV.

Cases, each --seconds long at --rate requests/s from --clients connections:
- GET /health: the baseline of the same run (no key, no database);
- GET /jobs/{id}/metrics?limit=100: a finished job's first 100 steps;
- GET /jobs/{id}/metrics: a queued job's empty page;
- POST /jobs: a new job each request (queued; the per-key quota raised for the run).

Prints one JSON object: per case p50/p90/p99/max in ms, the rate reached, the status codes,
and p50/p99 as ratios to /health's.    python -m bench.api_hey [--rate 1000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import statistics
import subprocess
from typing import Any

from bench.seed import cpu_description
from tests.service import Service, scratch_service, wait_until

SMALL = {"epochs": 1, "max_steps": 1}


def hey(
    svc: Service, method: str, path: str, *, rate: int, clients: int, seconds: int, auth: bool
) -> dict[str, Any]:
    cmd = ["hey", "-z", f"{seconds}s", "-c", str(clients), "-q", f"{rate / clients:g}"]
    cmd += ["-m", method, "-o", "csv"]
    if auth:
        cmd += ["-H", f"Authorization: Bearer {svc.keys[0]}"]
    if method == "POST":
        cmd += ["-T", "application/json", "-d", json.dumps(SMALL)]
    out = subprocess.run([*cmd, f"{svc.url}{path}"], capture_output=True, text=True, check=True)
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    times = sorted(float(r["response-time"]) * 1000 for r in rows)
    codes: dict[str, int] = {}
    for r in rows:
        codes[r["status-code"]] = codes.get(r["status-code"], 0) + 1

    def q(p: float) -> float:
        return round(times[min(len(times) - 1, int(p * len(times)))], 2)

    return {
        "requests": len(rows),
        "rate_reached": round(len(rows) / seconds),
        "status_codes": codes,
        "p50_ms": round(statistics.median(times), 2),
        "p90_ms": q(0.90),
        "p99_ms": q(0.99),
        "max_ms": round(times[-1], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=1000)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=int, default=10)
    args = p.parse_args()
    if shutil.which("hey") is None:
        raise SystemExit("bench: no `hey` on PATH (apt-get install hey)")
    load = {"rate": args.rate, "clients": args.clients, "seconds": args.seconds}
    env = {"TRAINQ_QUOTA_MAX_QUEUED": str(10 * args.rate * args.seconds)}
    with scratch_service(workers=1, env=env) as svc:
        c = svc.client()
        finished = c.submit({"epochs": 1, "max_steps": 100})["id"]
        wait_until(lambda: c.job(finished)["status"] == "succeeded", 300, "the job", 0.2)
        svc.stop_workers()  # nothing else on the machine while the load runs
        queued = c.submit(SMALL)["id"]
        cases = {
            "health": hey(svc, "GET", "/health", auth=False, **load),
            "get_metrics": hey(
                svc, "GET", f"/jobs/{finished}/metrics?limit=100", auth=True, **load
            ),
            "get_empty_metrics": hey(svc, "GET", f"/jobs/{queued}/metrics", auth=True, **load),
            "post_jobs": hey(svc, "POST", "/jobs", auth=True, **load),
        }
    base = cases["health"]
    for case in cases.values():
        case["p50_vs_health"] = round(case["p50_ms"] / base["p50_ms"], 2)
        case["p99_vs_health"] = round(case["p99_ms"] / base["p99_ms"], 2)
    print(
        json.dumps(
            {
                "benchmark": "api_hey",
                "cpu": cpu_description(),
                "uvicorn_processes": 1,
                "load": load,
                **cases,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

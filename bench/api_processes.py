"""What a second API process adds: `trainq serve --workers 1` against `--workers 2` on the
same PostgreSQL and redis-server, each loaded closed loop by bench/loadgen.py (50 keep-alive
clients, in a process of its own): GET /jobs/{id} and POST /jobs, requests/s and latency.

The processes, the load generator, Redis and PostgreSQL share this machine's cores: on a
machine of two cores (and other work), a second process has little to add, and the figure
says how much it did here.

    python -m bench.api_processes [--requests 3000] [--clients 50] [--rounds 2]

Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.api_load import load
from bench.scale import machine
from core.schema import upgrade
from tests.service import RedisServer, Service, postgres_database


def measure(svc: Service, n: int, clients: int) -> dict[str, Any]:
    job = svc.client().submit({"epochs": 1, "max_steps": 1})
    return {
        "get_job": load(svc, "GET", f"/jobs/{job['id']}", n=n, clients=clients),
        "post_jobs": load(svc, "POST", "/jobs", n=n, clients=clients),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rounds", type=int, default=2, help="1 and 2 processes, alternating")
    args = p.parse_args()
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="trainq-processes-") as tmp:
        root = Path(tmp)
        redis = RedisServer(root / "redis", appendfsync="everysec")  # as deployed
        redis.start()
        databases = postgres_database()
        url = next(databases)
        try:
            upgrade(url)
            (root / "data").mkdir()
            for _ in range(args.rounds):
                for processes in runs:
                    svc = Service(
                        data_dir=root / "data",
                        database_url=url,
                        redis=redis,
                        api_args=("--workers", str(processes)),
                    )
                    svc.start_api()
                    try:
                        runs[processes].append(measure(svc, args.requests, args.clients))
                    finally:
                        svc.stop()
        finally:
            redis.kill()
            next(databases, None)
    print(json.dumps(_report(args, runs), indent=2))


def _report(args: argparse.Namespace, runs: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    def rate(processes: int, route: str) -> float:
        return statistics.median(r[route]["requests_per_second"] for r in runs[processes])

    return {
        "benchmark": "api_processes",
        "machine": machine(),
        "database": "postgresql",
        "clients": args.clients,
        "requests_per_run": args.requests,
        "runs": {f"{k}_processes": v for k, v in runs.items()},
        "requests_per_second_median": {
            route: {"1_process": rate(1, route), "2_processes": rate(2, route)}
            for route in ("get_job", "post_jobs")
        },
        "two_over_one": {
            route: round(rate(2, route) / rate(1, route), 2) for route in ("get_job", "post_jobs")
        },
        "cpu_count": os.cpu_count(),
    }


if __name__ == "__main__":
    main()

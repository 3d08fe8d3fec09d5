"""The cost of the quota checks on POST /jobs: the same closed-loop load (bench/loadgen.py)
from a key with limits to check (max_queued and max_train_hours_per_day set: a lock, a count
and the trailing day's runs per owner per batch) and from the admin key (no limits: no
check), in alternating rounds against one API process (SQLite, real Redis, no worker).

Prints one JSON object.    python -m bench.quotas [--requests 2000] [--clients 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

from core.owners import owner_id
from tests.service import Service, scratch_service

SMALL = {"epochs": 1, "max_steps": 1}


def load(svc: Service, key: str, n: int, clients: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.loadgen", svc.url, "POST", "/jobs", "--key", key]
    cmd += ["-n", str(n), "-c", str(clients), "--body", json.dumps(SMALL)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with scratch_service(workers=0) as svc:
        limited = svc.keys[0]
        # Limits far above the load, so that every submission is checked and none refused.
        limits = {"max_queued": 10**9, "max_train_hours_per_day": 10**6}
        svc.client(svc.admin_key).set_quota(owner_id(limited), limits)
        runs: dict[str, list[dict[str, Any]]] = {"checked": [], "admin": []}
        for _ in range(args.rounds):
            runs["checked"].append(load(svc, limited, args.requests, args.clients))
            runs["admin"].append(load(svc, svc.admin_key, args.requests, args.clients))
    rate = {k: statistics.median(r["requests_per_second"] for r in v) for k, v in runs.items()}
    p99 = {k: statistics.median(r["p99_ms"] for r in v) for k, v in runs.items()}
    print(
        json.dumps(
            {
                "requests": args.requests,
                "clients": args.clients,
                "rounds": args.rounds,
                "requests_per_s": rate,
                "p99_ms": p99,
                "checked_over_admin": round(rate["checked"] / rate["admin"], 3),
                "statuses": {k: [r["status_codes"] for r in v] for k, v in runs.items()},
            }
        )
    )


if __name__ == "__main__":
    main()

"""Service overheads, measured on real parts (a redis-server process, SQLite, the API under
uvicorn, an RQ worker process):

1. enqueue -> running: POST /jobs until the worker has claimed the job (the row's
   started_at minus created_at), with an idle worker; the trainer's own start-up (data
   loading, model build) comes after that point and is reported separately.
2. streaming cost: the trainer's images/s with every step streamed to Redis (batched XADD,
   as the worker does) against the same run with streaming off, interleaved.

Prints one JSON object.    python -m bench.service [--jobs 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import uuid
from pathlib import Path
from typing import Any

from core.spec import JobSpec
from core.stream import publish_steps
from core.train import Callbacks, train
from tests.service import RedisServer, Service, scratch_service, wait_until


def _ts(value: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(value)
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def enqueue_to_running(svc: Service, jobs: int) -> dict[str, Any]:
    c = svc.client()
    c.submit({"epochs": 1, "max_steps": 1})  # warm-up: first job pays imports
    latencies, first_steps = [], []
    for _ in range(jobs):
        job = c.submit({"epochs": 1, "max_steps": 1})
        wait_until(lambda j=job: c.job(j["id"])["status"] == "succeeded", 60, "job", 0.01)
        done = c.job(job["id"])
        latencies.append((_ts(done["started_at"]) - _ts(done["created_at"])).total_seconds())
        first = c.metrics(done["id"])["items"][0]["time"]
        first_steps.append(first - _ts(done["started_at"]).timestamp())
    return {
        "jobs": jobs,
        "p50_ms": statistics.median(latencies) * 1000,
        "max_ms": max(latencies) * 1000,
        "trainer_startup_to_first_step_p50_ms": statistics.median(first_steps) * 1000,
    }


def streaming_cost(data_dir: Path, redis: RedisServer, rounds: int) -> dict[str, Any]:
    r = redis.client()
    spec = JobSpec(epochs=1, max_steps=150)
    on, off = [], []
    for _ in range(rounds):
        job = str(uuid.uuid4())
        cb = Callbacks(on_steps=lambda pts, j=job: publish_steps(r, j, pts, 200_000, attempt=1))
        on.append(train(spec, data_dir=data_dir, callbacks=cb).images_per_second)
        off.append(train(spec, data_dir=data_dir).images_per_second)
    r.close()
    on_med, off_med = statistics.median(on), statistics.median(off)
    return {
        "steps_per_run": 150,
        "rounds": rounds,
        "images_per_second_streaming": on_med,
        "images_per_second_off": off_med,
        "cost_fraction": 1 - on_med / off_med,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with scratch_service(workers=1) as svc:
        latency = enqueue_to_running(svc, args.jobs)
        svc.stop()  # the streaming runs below train in this process: nothing else competes
        stream = streaming_cost(svc.data_dir, svc.redis, args.rounds)
    print(
        json.dumps(
            {"benchmark": "service", "enqueue_to_running": latency, "streaming": stream}, indent=2
        )
    )


if __name__ == "__main__":
    main()

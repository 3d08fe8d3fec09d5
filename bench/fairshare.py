"""Fair share, measured on real parts (redis-server, SQLite, the API, two `trainq worker`
processes on the CPU): key A submits a backlog of short jobs, and key B submits five a
moment later (once A's first jobs run). Run twice, in the same run: with fair share (the
default) and with TRAINQ_FAIR_SHARE=false (the queue's head first, the baseline).

For each: how long B's first job waited to start, how long until B's last job ended (both
from B's first submission), and the first wait counted from the moment a worker freed up
after B submitted; in seconds and in units of the mean job duration (start to end). With
fair share, once B's jobs are done, A's remaining ones are canceled to end the run.
Prints one JSON object.

    python -m bench.fairshare [--jobs-a 100] [--jobs-b 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from client.http import ApiError, Client
from core.config import Settings
from core.db import Database
from core.queue import job_queue
from tests.service import Service, scratch_service, wait_until
from worker.fair_share import FairShare

SPEC = {"epochs": 1, "max_steps": 3, "export": ["torchscript"]}
WORKERS = 2
CHOICE_ROUNDS = 5
ENDED = ("succeeded", "failed", "canceled")


def _ts(value: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(value)
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _seconds(start: str, end: str) -> float:
    return (_ts(end) - _ts(start)).total_seconds()


def _cpu() -> str:
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def one_mode(fair: bool, jobs_a: int, jobs_b: int) -> dict[str, Any]:
    env = {"TRAINQ_FAIR_SHARE": "true" if fair else "false"}
    with scratch_service(workers=WORKERS, env=env) as svc:
        a, b = svc.client(svc.keys[0]), svc.client(svc.keys[1])
        admin = svc.client(svc.admin_key)
        a_ids = [a.submit(SPEC)["id"] for _ in range(jobs_a)]
        # "A moment later": once A's backlog holds the workers.
        wait_until(lambda: len(list(a.jobs(status="running"))) >= WORKERS, 120, "A running", 0.1)
        b_ids = [b.submit(SPEC)["id"] for _ in range(jobs_b)]
        choice = _choice_ms(svc) if fair else None
        wait_until(lambda: all(b.job(i)["status"] in ENDED for i in b_ids), 3600, "B", 0.5)
        if fair:
            _cancel_waiting(a, a_ids)
        wait_until(lambda: all(a.job(i)["status"] in ENDED for i in a_ids), 3600, "A", 0.5)
        figures = _figures([admin.job(i) for i in a_ids], [admin.job(i) for i in b_ids])
        return figures if choice is None else {**figures, **choice}


def _choice_ms(svc: Service) -> dict[str, Any]:
    """What one choice costs a worker with the whole backlog queued: the reads of
    FairShare.plan (it takes nothing), timed here, beside the workers."""
    r = svc.redis.client()
    db = Database(svc.database_url)
    try:
        fair = FairShare(r, db, Settings(), job_queue(r, svc.queue))
        times = []
        for _ in range(CHOICE_ROUNDS):
            began = time.perf_counter()
            fair.plan()
            times.append((time.perf_counter() - began) * 1000)
        return {
            "queued_at_choice": r.llen(fair.queue.key),
            "choice_ms_p50": round(statistics.median(times), 1),
        }
    finally:
        db.dispose()
        r.close()


def _cancel_waiting(c: Client, ids: list[str]) -> None:
    for job_id in ids:
        with suppress(ApiError):  # it ended meanwhile: 409
            c.cancel(job_id)


def _figures(a_jobs: list[dict[str, Any]], b_jobs: list[dict[str, Any]]) -> dict[str, Any]:
    ran = [j for j in [*a_jobs, *b_jobs] if j["status"] == "succeeded"]
    mean = statistics.mean(
        (_ts(j["finished_at"]) - _ts(j["started_at"])).total_seconds() for j in ran
    )
    submitted = min(_ts(j["created_at"]) for j in b_jobs)
    first = min(_ts(j["started_at"]) for j in b_jobs)
    last = max(_ts(j["finished_at"]) for j in b_jobs)
    # The first worker to free up after B submitted: an A job's end.
    freed = min(
        (
            _ts(j["finished_at"])
            for j in a_jobs
            if j["finished_at"] and _ts(j["finished_at"]) > submitted
        ),
        default=submitted,
    )
    wait = (first - submitted).total_seconds()
    after_free = max((first - freed).total_seconds(), 0.0)
    done = (last - submitted).total_seconds()
    return {
        "a_jobs_run": sum(1 for j in a_jobs if j["status"] == "succeeded"),
        "mean_job_s": round(mean, 2),
        "b_first_start_wait_s": round(wait, 2),
        "b_first_start_wait_jobs": round(wait / mean, 2),
        "b_first_start_after_a_worker_freed_s": round(after_free, 2),
        "b_first_start_after_a_worker_freed_jobs": round(after_free / mean, 2),
        "b_last_finish_s": round(done, 2),
        "b_last_finish_jobs": round(done / mean, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs-a", type=int, default=100)
    p.add_argument("--jobs-b", type=int, default=5)
    args = p.parse_args()
    began = time.monotonic()
    fair = one_mode(True, args.jobs_a, args.jobs_b)
    fifo = one_mode(False, args.jobs_a, args.jobs_b)
    out = {
        "cpu": _cpu(),
        "cpus": os.cpu_count(),
        "workers": WORKERS,
        "spec": SPEC,
        "jobs_a": args.jobs_a,
        "jobs_b": args.jobs_b,
        "fair_share": fair,
        "fifo": fifo,
        "bench_s": round(time.monotonic() - began, 1),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

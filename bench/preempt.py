"""Preemption, measured on real parts (redis-server, SQLite, the API, `trainq worker`
processes on the CPU): a running job's worker is stopped and a second worker is idle.

1. preempted: SIGTERM to the worker's launcher (what docker stop, a spot reclaim or a node
   drain send). The job checkpoints at its next step and goes back on the queue at once.
2. lost (the path a worker that dies takes, and what a SIGTERM cost before preemption,
   once the SIGKILL came): kill -9 of the launcher, its worker and work horse; the other
   launcher's reconciler requeues the job after the default heartbeat timeout (30 s,
   reconciling every 10 s), and it resumes from its last epoch checkpoint.

For each: seconds from the signal to the job running on the other worker, seconds until
the stopped launcher has exited, and the steps trained again. Prints one JSON object.

    python -m bench.preempt [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

from redis import Redis
from rq import Worker

from client.http import Client
from core.stream import latest_step, read
from tests.service import Service, children, kill_group, scratch_service, wait_until

SPEC = {"epochs": 20, "batch_size": 128, "seed": 0}  # far longer than a round
STOP_AT_STEP = 40  # mid epoch 2: after epoch 1's checkpoint, 8 steps into the next epoch
Stop = Callable[[subprocess.Popen[bytes]], None]


def sigterm(launcher: subprocess.Popen[bytes]) -> None:
    launcher.send_signal(signal.SIGTERM)


def launcher_of(svc: Service, worker_name: str) -> subprocess.Popen[bytes]:
    """The `trainq worker` process whose RQ worker is `worker_name` (<host>-cpu-<pid>)."""
    pid = int(worker_name.rsplit("-", 1)[1])
    return next(p for p in svc.workers if p.poll() is None and pid in children(p.pid))


def start_idle_worker(svc: Service, r: Redis) -> None:
    """A new `trainq worker`, returned once its RQ worker has registered."""
    launcher = svc.start_worker()
    [pid] = wait_until(lambda: children(launcher.pid), 60, "the RQ worker process", 0.1)
    suffix = f"-{pid}"
    wait_until(
        lambda: any(w.name.endswith(suffix) for w in Worker.all(connection=r)),
        60,
        "the new worker to register",
        0.1,
    )


def resumed_from(r: Redis, job_id: str, attempt: int) -> int:
    """The step the attempt's start status names (the stream holds it)."""
    for _, kind, data in read(r, job_id, None, 100_000):
        if kind == "status" and data.get("attempt") == attempt:
            return int(data["resumed_from_step"])
    raise AssertionError(f"no start status of attempt {attempt} of job {job_id}")


def one_round(svc: Service, c: Client, r: Redis, stop: Stop) -> dict[str, float]:
    job_id = c.submit(SPEC)["id"]
    wait_until(lambda: c.job(job_id)["progress"]["step"] >= STOP_AT_STEP, 120, "steps", 0.05)
    running = c.job(job_id)
    launcher = launcher_of(svc, running["worker"])
    start = time.monotonic()
    stop(launcher)
    trained = latest_step(r, job_id)  # the last step streamed when the stop took effect
    moved_s = exited_s = None
    while moved_s is None or exited_s is None:
        now = time.monotonic() - start
        if exited_s is None and launcher.poll() is not None:
            exited_s = now
        if moved_s is None:
            job = c.job(job_id)
            if job["status"] == "running" and job["attempt"] == running["attempt"] + 1:
                moved_s = now
        if now > 180:
            raise AssertionError(f"job {job_id} did not move to the other worker")
        time.sleep(0.05)
    repeated = max(trained - resumed_from(r, job_id, running["attempt"] + 1), 0)
    c.cancel(job_id)
    wait_until(lambda: c.job(job_id)["status"] == "canceled", 60, "the cancel", 0.1)
    start_idle_worker(svc, r)  # in place of the stopped one
    return {"to_running_s": moved_s, "worker_exit_s": exited_s, "steps_repeated": repeated}


def summary(rounds: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "rounds": len(rounds),
        **{f"median_{k}": statistics.median(r[k] for r in rounds) for k in rounds[0]},
        "each": rounds,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with scratch_service(workers=2) as svc:
        c = svc.client(svc.admin_key)  # it finds the job's worker by name: an admin's field
        r = svc.redis.client()
        preempted = [one_round(svc, c, r, sigterm) for _ in range(args.rounds)]
        lost = one_round(svc, c, r, kill_group)  # ~40 s: measured once
        r.close()
    out = {
        "spec": SPEC,
        "stopped_at_step": STOP_AT_STEP,
        "cpus": os.cpu_count(),
        "preempted_sigterm": summary(preempted),
        "lost_kill_9_default_timeouts": summary([lost]),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

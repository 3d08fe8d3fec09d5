"""What Redis holds for trainq, measured on a real redis-server. Prints one JSON object.

- per running job: the job's stream at its bound (Settings.metrics_maxlen), filled with the
  step entries of a real training run (mnist-sample, CPU), read with MEMORY USAGE; and the
  whole server's used_memory before and after, which counts the allocator's overhead too;
- per follower: `used_memory` and the clients' share of MEMORY STATS with N SSE followers
  connected to the API, one job each (each job's live feed holds a blocking XREAD
  connection in each API process), against none; and N followers of one job.

    python -m bench.redis_memory [--maxlen 200000 --maxlen 20000] [--followers 50]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from redis import Redis

from core.spec import JobSpec
from core.stream import WRITE_BATCH, Pending, epoch_entry, step_entries, stream_key, write
from core.train import Callbacks, EpochMetrics, StepMetrics, train
from core.train.data import write_mnist_sample
from tests.service import RedisServer, scratch_service, wait_until


def real_steps(data_dir: Path) -> tuple[list[StepMetrics], list[EpochMetrics]]:
    """The step and epoch metrics of one real epoch on mnist-sample."""
    steps: list[StepMetrics] = []
    epochs: list[EpochMetrics] = []
    spec = JobSpec(epochs=1, batch_size=32, export=["torchscript"])
    train(
        spec,
        data_dir=data_dir,
        device="cpu",
        callbacks=Callbacks(on_steps=steps.extend, on_epoch=epochs.append),
    )
    return steps, epochs


def entries(steps: list[StepMetrics], epoch: EpochMetrics, n: int) -> list[Pending]:
    """`n` step entries (the real run's, repeated with later step numbers and times), an
    epoch end after each run's worth."""
    out: list[Pending] = []
    per_epoch = len(steps)
    for i in range(n):
        base = steps[i % per_epoch]
        step = i + 1
        point = dataclasses.replace(base, step=step, epoch=i // per_epoch + 1, time=base.time + i)
        out += step_entries([point])
        if step % per_epoch == 0:
            out.append(epoch_entry(dataclasses.replace(epoch, step=step)))
    return out


def stream_at_bound(r: Redis, pending: list[Pending], maxlen: int) -> dict[str, Any]:
    job = f"bench-{maxlen}"
    r.delete(stream_key(job))
    before = int(r.info("memory")["used_memory"])
    for i in range(0, len(pending), WRITE_BATCH):
        write(r, job, 1, pending[i : i + WRITE_BATCH], maxlen)
    used = int(r.info("memory")["used_memory"]) - before
    usage = int(r.memory_usage(stream_key(job), samples=0) or 0)
    length = int(r.xlen(stream_key(job)))
    r.delete(stream_key(job))
    return {
        "maxlen": maxlen,
        "entries_written": len(pending),
        "entries_held": length,
        "memory_usage_bytes": usage,
        "bytes_per_entry": round(usage / length, 1),
        "used_memory_delta_bytes": used,
    }


def memory(r: Redis) -> dict[str, int]:
    stats: Any = r.memory_stats()
    return {
        "used_memory": int(r.info("memory")["used_memory"]),
        "clients_normal": int(stats["clients.normal"]),
        "connected_clients": int(r.info("clients")["connected_clients"]),
    }


def followers(n: int) -> dict[str, Any]:
    """Redis's memory with `n` SSE followers of `n` queued jobs, and of one job, against none."""
    with scratch_service(workers=0) as svc:
        r = svc.redis.client()
        c = svc.client()
        jobs = [c.submit({"epochs": 1})["id"] for _ in range(n)]
        out: dict[str, Any] = {"followers": n, "idle": memory(r)}
        for label, targets in (("one_job_each", jobs), ("all_on_one_job", [jobs[0]] * n)):
            out[label] = _with_followers(svc.url, svc.keys[0], targets, r, out["idle"])
        r.close()
        return out


def _with_followers(
    url: str, key: str, jobs: list[str], r: Redis, idle: dict[str, int]
) -> dict[str, Any]:
    stop = threading.Event()
    opened: list[int] = []

    def follow(job_id: str) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.stream("GET", f"{url}/jobs/{job_id}/events", headers=headers, timeout=None):
            opened.append(1)
            stop.wait()

    threads = [threading.Thread(target=follow, args=(j,), daemon=True) for j in jobs]
    for t in threads:
        t.start()
    wait_until(lambda: len(opened) == len(jobs), 60, "the followers to connect")
    time.sleep(1)  # each feed's first blocking XREAD
    now = memory(r)
    stop.set()
    for t in threads:
        t.join(timeout=10)
    time.sleep(1)
    n = len(jobs)
    return {
        **now,
        "used_memory_per_follower_bytes": round((now["used_memory"] - idle["used_memory"]) / n),
        "clients_per_follower_bytes": round((now["clients_normal"] - idle["clients_normal"]) / n),
        "redis_connections_per_follower": round(
            (now["connected_clients"] - idle["connected_clients"]) / n, 2
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--maxlen", type=int, action="append", help="default: 200000 and 20000")
    p.add_argument("--followers", type=int, default=50)
    args = p.parse_args()
    maxlens = sorted(args.maxlen or [200_000, 20_000])
    with tempfile.TemporaryDirectory(prefix="trainq-bench-") as tmp:
        root = Path(tmp)
        data = root / "data"
        write_mnist_sample(data / "mnist-sample" / "MNIST" / "raw")
        steps, epochs = real_steps(data)
        server = RedisServer(root / "redis", appendfsync="everysec")
        server.start()
        try:
            r = server.client()
            version = r.info("server")["redis_version"]
            pending = entries(steps, epochs[-1], max(maxlens) + max(maxlens) // 10)
            streams = [stream_at_bound(r, pending, m) for m in maxlens]
            r.close()
        finally:
            server.kill()
    print(
        json.dumps(
            {
                "benchmark": "redis_memory",
                "redis_version": version,
                "real_steps_per_epoch": len(steps),
                "stream_at_bound": streams,
                "sse_followers": followers(args.followers),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

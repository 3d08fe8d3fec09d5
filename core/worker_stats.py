"""Each worker's latest training figures in Redis, for the API's Prometheus endpoint:
one small hash per worker, written with the step blocks it already sends.

Both keys are bounded: a worker's hash expires TTL_S after its last report, and the index
of reporting workers is a sorted set scored by the time of each one's last report, cut to
the last TTL_S at every report (and expiring with the last one), so that workers that come
and go (each restart reports under a new name) never pile up in it, scraped or not.
See docs/operations.md ("Redis: memory and limits")."""

from __future__ import annotations

import time
from typing import Any

from redis import Redis

WORKERS_KEY = "trainq:worker-stats-index"
TTL_S = 120  # a worker that stops reporting drops out of /metrics


def stats_key(worker: str) -> str:
    return f"trainq:worker-stats:{worker}"


def publish_worker_stats(r: Redis, worker: str, fields: dict[str, float | str]) -> None:
    now = time.time()
    pipe = r.pipeline(transaction=False)
    mapping: Any = {**fields, "updated": now}
    pipe.hset(stats_key(worker), mapping=mapping)
    pipe.expire(stats_key(worker), TTL_S)
    pipe.zadd(WORKERS_KEY, {worker: now})
    pipe.zremrangebyscore(WORKERS_KEY, "-inf", now - TTL_S)
    pipe.expire(WORKERS_KEY, TTL_S)
    pipe.execute()


def read_worker_stats(r: Redis) -> dict[str, dict[str, str]]:
    names: Any = r.zrangebyscore(WORKERS_KEY, time.time() - TTL_S, "+inf")
    out: dict[str, dict[str, str]] = {}
    for raw in names:
        name = raw.decode() if isinstance(raw, bytes) else raw
        data: Any = r.hgetall(stats_key(name))
        if not data:
            continue
        out[name] = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in data.items()
        }
    return out

"""Each worker's latest training figures in Redis, for the API's Prometheus endpoint:
one small hash per worker, written with the step blocks it already sends."""

from __future__ import annotations

import time
from typing import Any

from redis import Redis

WORKERS_KEY = "trainq:worker-stats"
TTL_S = 120  # a worker that stops reporting drops out of /metrics


def stats_key(worker: str) -> str:
    return f"trainq:worker-stats:{worker}"


def publish_worker_stats(r: Redis, worker: str, fields: dict[str, float | str]) -> None:
    pipe = r.pipeline(transaction=False)
    mapping: Any = {**fields, "updated": time.time()}
    pipe.hset(stats_key(worker), mapping=mapping)
    pipe.expire(stats_key(worker), TTL_S)
    pipe.sadd(WORKERS_KEY, worker)
    pipe.execute()


def read_worker_stats(r: Redis) -> dict[str, dict[str, str]]:
    names: Any = r.smembers(WORKERS_KEY)
    out: dict[str, dict[str, str]] = {}
    for raw in names:
        name = raw.decode() if isinstance(raw, bytes) else raw
        data: Any = r.hgetall(stats_key(name))
        if not data:
            r.srem(WORKERS_KEY, name)
            continue
        out[name] = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in data.items()
        }
    return out

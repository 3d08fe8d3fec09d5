"""A full Redis (maxmemory reached, policy noeviction: every write refused with OOM) is a
503 with Retry-After from the API and leaves no job behind, while a running job trains on,
holds the points Redis refuses, and sends them once Redis has room again."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis
from redis.exceptions import OutOfMemoryError

from core.stream import stream_key
from tests.faults.test_faults import RECOVERY, assert_intact, wait_status, wait_step
from tests.service import Service, fresh_service, wait_until

SPEC = {"epochs": 8, "batch_size": 128, "seed": 5}  # 32 steps an epoch
STEPS = 8 * 32


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    with fresh_service(tmp_path, data_dir, RECOVERY) as service:
        yield service


def fill(r: Redis) -> int:
    """Bound Redis a little above what it holds now and write until it refuses, then hold
    it there: a full Redis, as a deployment with maxmemory and noeviction meets it, that
    no freed client buffer makes room in. The keys written."""
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + (1 << 20))
    n = 0
    while True:
        try:
            r.set(f"filler:{n}", b"x" * 4096)
        except OutOfMemoryError:
            r.config_set("maxmemory", int(r.info("memory")["used_memory"]) - (1 << 20))
            return n
        n += 1


def lift(r: Redis, fillers: int) -> None:
    r.config_set("maxmemory", 0)
    r.delete(*(f"filler:{i}" for i in range(fillers)))


def epochs_done(svc: Service, job_id: str) -> int:
    return len(svc.client().epochs(job_id))


def test_a_full_redis_is_503_while_a_running_job_trains_on_and_keeps_every_point(
    svc: Service, tmp_path: Path, worker: subprocess.Popen[bytes]
) -> None:
    c = svc.client()
    job = c.submit(SPEC)
    waiting = c.submit(SPEC | {"epochs": 1})  # behind it on the one worker
    wait_step(c, job["id"], 10)
    r = svc.redis.client()
    fillers = fill(r)
    try:
        auth = {"Authorization": f"Bearer {svc.keys[0]}"}
        refused = httpx.post(f"{svc.url}/jobs", json=SPEC, headers=auth, timeout=30)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "30"
        assert "full" in refused.json()["detail"]
        assert {j["id"] for j in c.jobs()} == {job["id"], waiting["id"]}  # no half a job
        # A cancel is the database's: taken (202) though Redis cannot be told.
        assert c.cancel(waiting["id"])["status"] == "canceled"
        # Reads still answer, and the running job trains on through whole epochs.
        at = epochs_done(svc, job["id"])
        wait_until(lambda: epochs_done(svc, job["id"]) >= at + 2, 120, "two epochs", 0.5)
        assert c.job(job["id"])["status"] == "running"
        [(top, _)] = r.xrevrange(stream_key(job["id"]), count=1)
        assert int(top.split(b"-")[0]) < 32 * epochs_done(svc, job["id"])  # refused, held
    finally:
        lift(r, fillers)
    done = wait_status(c, job["id"], "succeeded")
    assert_intact(c, done, tmp_path, STEPS)
    # The points Redis refused were held, and sent once it had room: every step is in
    # the stream, once, in order.
    ids = [raw.decode() for raw, _ in r.xrange(stream_key(job["id"]))]
    assert [int(i.split("-")[0]) for i in ids if i.endswith("-0")] == list(range(1, STEPS + 1))
    assert c.job(waiting["id"])["status"] == "canceled"
    r.close()

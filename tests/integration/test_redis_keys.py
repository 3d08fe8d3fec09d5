"""Nothing trainq leaves in Redis grows without a bound: after real jobs end (succeeded,
canceled mid-run, failed), every key in a redis-server of their own either expires or is
one of the few keys named below, each bounded by something the README names."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.queue import FAILURE_TTL_S, RESULT_TTL_S
from core.stream import FINISHED_TTL_S
from core.worker_stats import TTL_S as WORKER_STATS_TTL_S
from tests.recovery import FAST_RECOVERY
from tests.service import Service, fresh_service, wait_until

# Keys with no TTL, each held to a bound by what it holds (the README's list).
UNEXPIRING = {
    # RQ: the queue's waiting entry ids (bounded by the jobs queued: the quotas) and the
    # set of queue names (one per queue).
    r"rq:queue:[^:]+": "waiting entries",
    r"rq:queues": "queue names",
    # RQ: the live workers (RQ's registry clean-up drops dead ones).
    r"rq:workers(:[^:]+)?": "live workers",
    # RQ's registries: sorted sets of entry ids scored by when each expires; RQ's clean-up
    # (every worker, every 10 minutes) removes the expired.
    r"rq:(wip|finished|failed|canceled|deferred|scheduled):[^:]+": "registry",
}


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    with fresh_service(tmp_path, data_dir, FAST_RECOVERY) as service:
        service.start_worker()
        service.wait_for_workers(1)
        yield service


def ended(svc: Service, job_id: str) -> str:
    c = svc.client()
    return str(
        wait_until(
            lambda: (s := c.job(job_id)["status"]) in ("succeeded", "failed", "canceled") and s,
            180,
            f"job {job_id} to end",
            0.2,
        )
    )


@pytest.mark.slow
def test_every_key_left_after_jobs_end_expires_or_is_a_named_bounded_one(svc: Service) -> None:
    c = svc.client()
    done = c.submit({"epochs": 1, "max_steps": 5, "export": ["torchscript"]})
    assert ended(svc, done["id"]) == "succeeded"
    long = c.submit({"epochs": 20})
    wait_until(lambda: c.job(long["id"])["progress"]["step"] >= 3, 120, "a running job", 0.1)
    c.cancel(long["id"])
    assert ended(svc, long["id"]) == "canceled"
    timed_out = c.submit({"epochs": 50, "max_duration_s": 1})
    assert ended(svc, timed_out["id"]) == "failed"
    # A scrape reads the workers' figures; followers read the streams.
    admin = {"Authorization": f"Bearer {svc.admin_key}"}
    assert httpx.get(f"{svc.url}/metrics", headers=admin).status_code == 200
    assert list(c.events(done["id"]))[-1]["data"]["status"] == "succeeded"

    r = svc.redis.client()
    longest = max(FINISHED_TTL_S, RESULT_TTL_S, FAILURE_TTL_S, WORKER_STATS_TTL_S)
    unbounded = []
    for raw in r.scan_iter(count=1000):
        key = raw.decode()
        ttl = r.ttl(key)
        if ttl == -1 and not any(re.fullmatch(p, key) for p in UNEXPIRING):
            unbounded.append(key)
        assert ttl <= longest, (key, ttl)
    r.close()
    assert unbounded == []
    # What a job of ours keeps expires within a day of its end.
    for job in (done, long, timed_out):
        keys = svc.redis.client().keys(f"trainq:job:{job['id']}:*")
        assert keys
        assert all(0 < svc.redis.client().ttl(k) <= FINISHED_TTL_S for k in keys)

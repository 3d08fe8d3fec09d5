"""Fair share over real processes (the API under uvicorn, `trainq worker` processes, SQLite,
redis-server): whose job a free worker takes (worker.fair_share). The jobs are queued
before any worker starts, so that the order they start in is the workers' choice alone."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rq.job import Job as RQJob
from rq.job import JobStatus as RQStatus
from rq.serializers import JSONSerializer

from client.http import ApiError, Client
from core.db import Database
from core.owners import owner_id
from core.queue import enqueue_jobs, job_queue
from core.spec import JobSpec
from core.store import create_job
from tests.service import Service, fresh_service, kill_group, status_of, wait_until

pytestmark = pytest.mark.slow  # real workers and services: the full run, not --fast

SPEC: dict[str, Any] = {"epochs": 1, "max_steps": 3, "export": ["torchscript"]}
ONE_AT_A_TIME = {"TRAINQ_QUOTA_MAX_RUNNING": "1"}


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    with fresh_service(tmp_path, data_dir) as s:
        yield s


@pytest.fixture
def limited(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    """Every key may run one job at once."""
    with fresh_service(tmp_path, data_dir, ONE_AT_A_TIME) as s:
        yield s


def finished(admin: Client, ids: list[str], timeout: float = 240) -> list[dict[str, Any]]:
    """The jobs, once every one has succeeded (a direct entry has no row until it runs)."""

    def done() -> bool:
        return all(status_of(admin, i) == "succeeded" for i in ids)

    wait_until(done, timeout, "every job to succeed", interval=0.5)
    return [admin.job(i) for i in ids]


def at(job: dict[str, Any], field: str) -> dt.datetime:
    return dt.datetime.fromisoformat(job[field])


def start_order(jobs: list[dict[str, Any]]) -> list[str]:
    return [j["id"] for j in sorted(jobs, key=lambda j: at(j, "started_at"))]


def assert_one_at_a_time(jobs: list[dict[str, Any]]) -> None:
    """No two of these jobs ran at once: each started after the one before it ended (both
    times are the database's)."""
    ordered = sorted(jobs, key=lambda j: at(j, "started_at"))
    for before, after in itertools.pairwise(ordered):
        assert at(after, "started_at") >= at(before, "finished_at"), (before, after)


def test_one_worker_starts_the_second_owners_job_before_the_firsts_backlog(
    svc: Service,
) -> None:
    alice, bob = svc.client(svc.keys[0]), svc.client(svc.keys[1])
    a = [alice.submit(SPEC)["id"] for _ in range(4)]
    b = bob.submit(SPEC)["id"]
    svc.start_worker()
    order = start_order(finished(svc.client(svc.admin_key), [*a, b]))
    assert order == [a[0], b, *a[1:]]
    assert "by fair share" in svc.logs(tail=None)


def test_priority_orders_one_owners_jobs(svc: Service) -> None:
    alice = svc.client()
    low, normal, high = (
        alice.submit({**SPEC, "priority": p})["id"] for p in ("low", "normal", "high")
    )
    svc.start_worker()
    assert start_order(finished(svc.client(svc.admin_key), [low, normal, high])) == [
        high,
        normal,
        low,
    ]


def test_an_owner_at_max_running_waits_while_another_owners_job_runs(limited: Service) -> None:
    for _ in range(2):
        limited.start_worker()
    limited.wait_for_workers(2)
    alice, bob = limited.client(limited.keys[0]), limited.client(limited.keys[1])
    a = [alice.submit(SPEC)["id"] for _ in range(3)]
    b = bob.submit(SPEC)["id"]
    jobs = finished(limited.client(limited.admin_key), [*a, b])
    assert_one_at_a_time(jobs[:3])  # alice's waited, none failed
    assert at(jobs[3], "started_at") < at(jobs[2], "started_at")  # bob's ran meanwhile


@pytest.fixture
def rationed(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    """Every key may train for a second and a half a day."""
    with fresh_service(tmp_path, data_dir, {"TRAINQ_QUOTA_MAX_TRAIN_HOURS_PER_DAY": "0.0004"}) as s:
        yield s


def test_an_owner_past_its_training_hours_waits_and_others_run(rationed: Service) -> None:
    """Alice's three jobs were all admitted while her day was unused; once the first has
    used it up, a free worker starts Bob's job, queued after hers, and none of her two
    others (they wait for the hours to age out; they are not failed)."""
    alice, bob = rationed.client(rationed.keys[0]), rationed.client(rationed.keys[1])
    a = [alice.submit({**SPEC, "max_steps": 30})["id"] for _ in range(3)]
    rationed.start_worker()
    admin = rationed.client(rationed.admin_key)
    (first,) = finished(admin, a[:1])
    assert at(first, "finished_at") - at(first, "started_at") > dt.timedelta(seconds=1.44)
    b = bob.submit(SPEC)["id"]
    finished(admin, [b])
    assert [status_of(admin, i) for i in a[1:]] == ["queued", "queued"]


def test_deleting_an_owners_ended_jobs_gives_back_none_of_its_hours(rationed: Service) -> None:
    """Alice's first job uses up her day, and she deletes it: her next submission is still
    refused (429), her usage still shows the time, and a free worker still starts Bob's job
    before her other one, which waits."""
    alice, bob = rationed.client(rationed.keys[0]), rationed.client(rationed.keys[1])
    a = [alice.submit({**SPEC, "max_steps": 30})["id"] for _ in range(2)]
    rationed.start_worker()
    admin = rationed.client(rationed.admin_key)
    (first,) = finished(admin, a[:1])
    trained = at(first, "finished_at") - at(first, "started_at")
    alice.delete(a[0])
    with pytest.raises(ApiError) as refused:
        alice.submit(SPEC)
    assert refused.value.status == 429
    assert refused.value.body["limit"] == "max_train_hours_per_day"
    hours = alice.usage()["caller"]["usage"]["train_hours_24h"]
    assert hours == pytest.approx(trained.total_seconds() / 3600, rel=0.05)
    b = bob.submit(SPEC)["id"]
    finished(admin, [b])
    assert status_of(admin, a[1]) == "queued"


def test_a_direct_entry_runs_and_counts_against_its_owner(limited: Service) -> None:
    """Entries another service puts straight onto the queue, with no row yet: they run, as
    their payload's owner's, and that owner's max_running holds for them too."""
    r = limited.redis.client()
    queue = job_queue(r, limited.queue)
    owner = owner_id(limited.keys[0])
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for job_id in ids:
        queue.enqueue("worker.tasks.train", spec=SPEC, owner=owner, job_id=job_id)
    for _ in range(2):
        limited.start_worker()
    jobs = finished(limited.client(limited.keys[0]), ids)  # the owner's key sees them
    assert_one_at_a_time(jobs)
    r.close()


FAST = {
    "TRAINQ_HEARTBEAT_TIMEOUT_S": "4",
    "TRAINQ_RECONCILE_INTERVAL_S": "1",
    "TRAINQ_QUEUE_GRACE_S": "2",
    "TRAINQ_COMMIT_WAIT_S": "600",  # the worker waits for the row until it is killed
}


def test_a_worker_killed_after_a_fair_take_leaves_a_job_that_runs_once(
    tmp_path: Path, data_dir: Path
) -> None:
    with fresh_service(tmp_path, data_dir, FAST) as svc:
        r = svc.redis.client()
        worker = svc.start_worker()
        svc.wait_for_workers(1)
        job_id = str(uuid.uuid4())
        # As the API does: the entry first, the row's commit after.
        enqueue_jobs(r, queue=svc.queue, jobs=[(job_id, SPEC, None)], timeout_s=600)

        def entry_status() -> RQStatus:
            return RQJob.fetch(job_id, connection=r, serializer=JSONSerializer).get_status()

        wait_until(lambda: entry_status() == RQStatus.STARTED, 60, "the worker to take it")
        assert f"took entry {job_id} by fair share" in svc.logs(tail=None)
        kill_group(worker)  # while it waits for the row, before any claim
        db = Database(svc.database_url)
        try:
            with db.writer() as s:
                create_job(s, job_id=job_id, spec=JobSpec(**SPEC), owner=None, queue_entry=job_id)
        finally:
            db.dispose()
        svc.start_worker()
        [done] = finished(svc.client(svc.admin_key), [job_id], timeout=120)
        assert done["attempt"] == 1
        assert "enqueued again" in svc.logs(tail=None)
        r.close()

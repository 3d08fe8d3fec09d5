"""A worker killed after RQ handed it an entry but before it claimed the job: RQ keeps the
entry STARTED for many minutes, and the reconciler must not take that for a live one.
Real worker processes, SQLite and redis-server; timings shortened as in test_faults."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rq.job import Job as RQJob
from rq.job import JobStatus as RQStatus
from rq.serializers import JSONSerializer

from core.db import Database
from core.queue import enqueue_jobs
from core.spec import JobSpec
from core.store import create_job
from tests.service import Service, fresh_service, kill_group, wait_until

FAST = {
    "TRAINQ_HEARTBEAT_TIMEOUT_S": "4",
    "TRAINQ_RECONCILE_INTERVAL_S": "1",
    "TRAINQ_QUEUE_GRACE_S": "2",
    "TRAINQ_COMMIT_WAIT_S": "600",  # the worker waits for the row until it is killed
}
SPEC = {"epochs": 1, "batch_size": 128, "max_steps": 4}


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    with fresh_service(tmp_path, data_dir, FAST) as service:
        yield service


def test_a_worker_killed_between_dequeue_and_claim_leaves_a_job_that_runs_once(
    svc: Service,
) -> None:
    r = svc.redis.client()
    worker = svc.start_worker()
    svc.wait_for_workers(1)
    job_id = str(uuid.uuid4())
    # As the API does: the entry first, the row's commit after.
    enqueue_jobs(r, queue=svc.queue, jobs=[(job_id, SPEC, None)], timeout_s=600)

    def entry_status() -> RQStatus:
        return RQJob.fetch(job_id, connection=r, serializer=JSONSerializer).get_status()

    wait_until(lambda: entry_status() == RQStatus.STARTED, 60, "the worker to take the entry")
    kill_group(worker)  # while it waits for the row, before any claim
    db = Database(svc.database_url)
    try:
        with db.writer() as s:
            create_job(s, job_id=job_id, spec=JobSpec(**SPEC), owner=None, queue_entry=job_id)
    finally:
        db.dispose()
    assert entry_status() == RQStatus.STARTED  # RQ's clean-up comes minutes later

    svc.start_worker()
    admin = svc.client(svc.admin_key)
    wait_until(
        lambda: admin.job(job_id)["status"] == "succeeded", 120, "the job to run elsewhere", 0.5
    )
    done = admin.job(job_id)
    assert done["attempt"] == 1
    assert [p["step"] for p in admin.metrics(job_id, limit=100)["items"]] == [1, 2, 3, 4]
    assert "enqueued again" in svc.logs(tail=None)

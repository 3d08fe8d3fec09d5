"""A SIGTERM that reaches a worker while its work horse starts, before the job function's
own handler is in place (worker.preemption), hands the job back at once, as one that comes
mid-epoch does: no reconciler runs here to requeue it instead."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from core.db import Database
from core.queue import enqueue_job
from core.spec import JobStatus
from core.store import get_job
from tests.recovery import FAST_RECOVERY
from tests.service import REPO, Service, fresh_service, kill_group, wait_until


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    """Migrated, with no API: nothing but the worker under test acts on the job."""
    with fresh_service(tmp_path, data_dir, FAST_RECOVERY, api=False) as service:
        service.migrate()
        yield service


@pytest.mark.slow  # a worker process: torch is loaded before its horse forks
def test_a_sigterm_before_the_horse_handles_it_hands_the_job_back(
    svc: Service, tmp_path: Path
) -> None:
    job_id = str(uuid.uuid4())
    with svc.redis.client() as r:
        spec = {"epochs": 1, "batch_size": 128}
        enqueue_job(r, queue=svc.queue, job_id=job_id, spec=spec, owner=None, timeout_s=600)
    marker = tmp_path / "paused"
    command = [sys.executable, "-m", "tests.faults.paused_horse", "--name", "paused"]
    with (tmp_path / "paused-worker.log").open("ab") as log:
        worker = subprocess.Popen(
            [*command, "--queue", svc.queue],
            cwd=REPO,
            env=svc.env() | {"PAUSED_HORSE_MARKER": str(marker)},
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        wait_until(marker.exists, 60, "the work horse to pause before the job function")
        worker.send_signal(signal.SIGTERM)  # as the launcher passes on docker stop's
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            kill_group(worker)
        print((tmp_path / "paused-worker.log").read_text()[-3000:])
    db = Database(svc.database_url)
    try:
        with db.reader() as s:
            job = get_job(s, job_id=job_id)
            assert job is not None, "the horse died before the job function ran"
            assert (job.status, job.attempt, job.preemptions) == (JobStatus.queued, 1, 1)
    finally:
        db.dispose()
    with svc.redis.client() as r:
        queue = Queue(svc.queue, connection=r, serializer=JSONSerializer)
        assert f"{job_id}-p1" in queue.job_ids  # back on the queue, for any worker

"""A worker of another trainq than the API (mid-upgrade, or one host left behind): it must
not blame the user for a spec it cannot read. It hands the job back for a worker of the
API's own version, and fails it as `worker_version_skew` only after a bound; the admin's
/health names the versions it sees."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.db import Database
from core.spec import SPEC_VERSION
from core.store import get_job
from tests.service import REPO, Service, fresh_service, kill_group, status_of, wait_until

# A worker from before JobSpec.priority: today's worker, its JobSpec without the field.
OLDER_WORKER = """
import pydantic
import core.spec as spec
fields = {k: (f.annotation, f) for k, f in spec.JobSpec.model_fields.items() if k != "priority"}
older = pydantic.create_model("JobSpec", __config__=spec.JobSpec.model_config, **fields)
spec.JobSpec, spec.SPEC_VERSION = older, spec.spec_version(older)
from worker.rq_worker import main
main()
"""
SPEC = {
    "epochs": 1,
    "max_steps": 2,
    "batch_size": 128,
    "export": ["torchscript"],
    "priority": "high",
}


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Service]:
    with fresh_service(tmp_path_factory.mktemp("skew"), data_dir) as service:
        yield service


def older_worker(svc: Service, **env: str) -> subprocess.Popen[bytes]:
    assert svc.log_dir is not None
    with (svc.log_dir / "older-worker.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-c", OLDER_WORKER, "--name", "older", "--queue", svc.queue],
            cwd=REPO,
            env=svc.env() | env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def queue_entry(svc: Service, job_id: str) -> str | None:
    db = Database(svc.database_url)
    try:
        with db.reader() as s:
            job = get_job(s, job_id=job_id)
            return job.queue_entry if job else None
    finally:
        db.dispose()


@pytest.mark.slow
def test_a_job_an_older_worker_cannot_read_waits_for_a_newer_one(svc: Service) -> None:
    older = older_worker(svc, TRAINQ_VERSION_SKEW_PAUSE_S="0.2")
    try:
        svc.wait_for_workers(1)
        health = svc.client(svc.admin_key).health()
        assert health["version_skew"] is True
        (seen,) = health["workers"]
        assert seen["versions"]["spec"] != SPEC_VERSION
        assert [v["spec"] for v in health["versions"]] == [SPEC_VERSION, seen["versions"]["spec"]]
        c = svc.client()
        job = c.submit(SPEC)
        wait_until(
            lambda: (queue_entry(svc, job["id"]) or "").endswith("-v2"),
            30,
            "the older worker to hand the job back twice",
            0.1,
        )
        assert c.job(job["id"])["status"] == "queued"
        older.send_signal(signal.SIGTERM)  # as an upgrade stops it: it ends its hand-back
        older.wait(timeout=30)
    finally:
        kill_group(older)
    svc.start_worker()
    done = wait_until(
        lambda: status_of(c, job["id"]) in ("succeeded", "failed") and c.job(job["id"]),
        120,
        "a worker of the API's version to run the job",
        0.2,
    )
    assert (done["status"], done["attempt"], done["error"]) == ("succeeded", 1, None), done
    svc.stop_workers()


@pytest.mark.slow
def test_a_job_no_worker_can_read_fails_as_version_skew(svc: Service) -> None:
    older = older_worker(svc, TRAINQ_VERSION_SKEW_PAUSE_S="0", TRAINQ_VERSION_SKEW_HAND_BACKS="2")
    try:
        c = svc.client()
        job = c.submit(SPEC)
        wait_until(lambda: status_of(c, job["id"]) == "failed", 60, "the job to fail", 0.1)
    finally:
        kill_group(older)
    done = c.job(job["id"])
    assert (done["attempt"], done["error"]["code"]) == (0, "worker_version_skew"), done
    assert "JobSpec version" in done["error"]["message"]
    assert queue_entry(svc, job["id"]) == f"{job['id']}-v2"

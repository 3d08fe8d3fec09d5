"""A sweep survives its machines: a worker killed mid-trial, one that died between a trial's
end and the next trial's creation, and a next trial committed but never put on the queue.
In each, every trial runs, none twice, and the sweep ends with exactly its budget."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from client.http import Client
from core.config import Settings
from core.db import Database, Job
from core.spec import JobStatus
from core.store import claim_job, end_job
from core.sweeps import trials
from tests.recovery import FAST_RECOVERY
from tests.service import Service, fresh_service, kill_group, wait_until

pytestmark = pytest.mark.slow
BASE = {"epochs": 3, "batch_size": 128, "augment": "none", "export": ["torchscript"]}


def sweep_body(n: int, **base: Any) -> dict[str, Any]:
    return {
        "base": {**BASE, **base},
        "space": {"lr": {"log_uniform": [5e-4, 5e-3]}},
        "sampler": {"name": "random", "seed": 3},
        "pruner": {"name": "none"},
        "trials": n,
        "parallel": 1,
    }


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    with fresh_service(tmp_path, data_dir, FAST_RECOVERY) as service:
        yield service


def trial_rows(svc: Service, sweep_id: str) -> list[Job]:
    db = Database(svc.database_url)
    try:
        with db.reader() as s:
            return list(s.scalars(select(Job).where(Job.sweep_id == sweep_id)))
    finally:
        db.dispose()


def ended(c: Client, sweep_id: str, timeout: float = 240) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        sweep = c.sweep(sweep_id)
        return sweep if sweep["status"] != "running" else None

    return wait_until(done, timeout, f"sweep {sweep_id} to end")  # type: ignore[no-any-return]


def assert_each_trial_once(svc: Service, sweep: dict[str, Any], n: int) -> list[Job]:
    rows = trial_rows(svc, sweep["id"])
    assert sorted(r.trial_number for r in rows) == list(range(n))  # type: ignore[type-var]
    assert sweep["budget"]["created"] == n and len(sweep["trials"]) == n
    return rows


def test_a_worker_killed_mid_trial(svc: Service) -> None:
    c = svc.client()
    worker = svc.start_worker()
    sweep = c.create_sweep(sweep_body(2))
    first = sweep["trials"][0]["job_id"]
    wait_until(lambda: c.job(first)["progress"]["step"] > 40, 120, "trial 0 mid epoch 2")
    kill_group(worker)  # launcher, RQ worker and work horse: no `finally` runs
    svc.start_worker()
    final = ended(c, sweep["id"])
    assert final["status"] == "succeeded"
    rows = assert_each_trial_once(svc, final, 2)
    attempts = {r.trial_number: r.attempt for r in rows}
    assert attempts == {0: 2, 1: 1}  # trial 0 resumed once; trial 1 ran once
    assert all(r.status == JobStatus.succeeded for r in rows)


def test_a_trial_ended_by_a_worker_that_died_before_the_next(svc: Service) -> None:
    """What a worker does before it dies: the trial's end, and nothing after it. The
    reconciler in `trainq serve` makes the next trial, once."""
    c = svc.client()
    sweep = c.create_sweep(sweep_body(2, max_steps=5, epochs=1))
    first = sweep["trials"][0]["job_id"]
    db = Database(svc.database_url)
    try:
        with db.writer() as s:
            assert claim_job(s, job_id=first, worker="gone", device="cpu") is not None
        with db.writer() as s:
            end_job(s, job_id=first, status=JobStatus.failed, code="worker_lost", message="x")
    finally:
        db.dispose()
    wait_until(lambda: c.sweep(sweep["id"])["budget"]["created"] == 2, 30, "the next trial")
    svc.start_worker()
    final = ended(c, sweep["id"])
    rows = assert_each_trial_once(svc, final, 2)
    assert {r.trial_number: r.status for r in rows} == {0: "failed", 1: "succeeded"}
    assert final["status"] == "succeeded"


def test_a_next_trial_committed_but_never_queued(svc: Service) -> None:
    """The decider committed the next trial and died before its queue entry: the reconciler
    finds the queued row without an entry and enqueues it; it runs once."""
    c = svc.client()
    sweep = c.create_sweep(sweep_body(2, max_steps=5, epochs=1))
    first = sweep["trials"][0]["job_id"]
    db = Database(svc.database_url)
    try:
        with db.writer() as s:  # the end and the top-up in one: no reconciler in between
            assert claim_job(s, job_id=first, worker="gone", device="cpu") is not None
            end_job(s, job_id=first, status=JobStatus.failed, code="worker_lost", message="x")
            (made,) = trials.top_up(s, Settings(), sweep_id=sweep["id"])
    finally:
        db.dispose()
    svc.start_worker()
    final = ended(c, sweep["id"])
    rows = assert_each_trial_once(svc, final, 2)
    (second,) = [r for r in rows if r.id == made.id]
    assert second.status == JobStatus.succeeded and second.attempt == 1
    assert second.queue_entry != made.id  # enqueued again, under the reconciler's entry

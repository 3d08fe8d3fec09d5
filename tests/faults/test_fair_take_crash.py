"""A worker that dies between its fair-share take and its claim (kill -9, or the take's
reply lost on the wire) leaves the entry in RQ's intermediate list: the job must still run
soon, and its owner's slot must not stay taken by it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.config import Settings
from core.db import Database
from core.queue import job_queue
from tests.recovery import FAST_RECOVERY
from tests.service import Service, fresh_service, status_of, wait_until
from worker.fair_share import FairShare

pytestmark = pytest.mark.slow
SPEC = {"epochs": 1, "max_steps": 3, "export": ["torchscript"]}


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    env = FAST_RECOVERY | {"TRAINQ_QUOTA_MAX_RUNNING": "1"}
    with fresh_service(tmp_path, data_dir, env) as service:
        yield service


def test_a_take_whose_taker_died_runs_soon_and_frees_its_owners_slot(svc: Service) -> None:
    alice = svc.client(svc.keys[0])
    first = alice.submit(SPEC)["id"]
    second = alice.submit(SPEC)["id"]
    r = svc.redis.client()
    db = Database(svc.database_url)
    try:
        # What a worker does before it dies: the take, and nothing after it.
        fair = FairShare(r, db, Settings(quota_max_running=1), job_queue(r, svc.queue))
        assert fair.take() == first.encode()
        svc.start_worker()
        wait_until(lambda: status_of(alice, first) == "succeeded", 90, "the taken job to run")
        wait_until(lambda: status_of(alice, second) == "succeeded", 90, "the next to run")
    finally:
        db.engine.dispose()
        r.close()

"""A batch of submissions planned together (api.services.submitter._plan): a submission sent
again with the same Idempotency-Key in the same batch shares the fate of the one it repeats,
so that no client is told of a job that was never written."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from api.services.submitter import Submission, _plan
from core.config import Settings
from core.errors import DatasetGone
from core.quotas import JobQuotas
from core.spec import JobSpec
from tests.db import migrated


def _submission(loop: asyncio.AbstractEventLoop, dataset: str, key: str | None) -> Submission:
    spec = JobSpec.model_validate({"dataset": dataset, "epochs": 1})
    return Submission(spec=spec, owner="o", idempotency_key=key, quota_owner=None, loop=loop)


def test_a_repeat_of_a_refused_submission_is_refused_too(tmp_path: Path) -> None:
    gone = f"ds:{uuid.uuid4()}"  # a set deleted after the route looked it up
    loop = asyncio.new_event_loop()
    try:
        batch = [_submission(loop, gone, "k"), _submission(loop, gone, "k")]
        with migrated(f"sqlite:///{tmp_path / 'db.sqlite'}") as db, db.writer() as s:
            plan = _plan(s, batch, JobQuotas(s, Settings(), []))
    finally:
        loop.close()
    assert [p.how for p in plan] == ["refused", "refused"]
    assert all(isinstance(p.outcome(None), DatasetGone) for p in plan)


def test_a_repeat_in_the_batch_answers_the_job_it_repeats(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    try:
        batch = [_submission(loop, "mnist-sample", "k"), _submission(loop, "mnist-sample", "k")]
        with migrated(f"sqlite:///{tmp_path / 'db.sqlite'}") as db, db.writer() as s:
            plan = _plan(s, batch, JobQuotas(s, Settings(), []))
    finally:
        loop.close()
    assert [p.how for p in plan] == ["new", "again"]
    first, second = (p.outcome(None) for p in plan)
    assert isinstance(first, tuple) and isinstance(second, tuple)
    assert first[0].id == second[0].id and (first[1], second[1]) == (True, False)

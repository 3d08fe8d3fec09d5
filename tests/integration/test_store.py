"""Job state transitions on both databases: a terminal status never reverts; an epoch that
is run again replaces what was stored, never duplicates it."""

from __future__ import annotations

import datetime as dt

import pytest

from core.db import Database, utcnow
from core.errors import JobSuperseded
from core.spec import ExportFormat, JobStatus
from core.store import (
    claim_job,
    end_job,
    get_job,
    heartbeat,
    request_cancel,
    requeue_job,
    save_epoch,
    step_metrics,
    succeed_job,
)
from core.train import EpochMetrics, StepMetrics
from core.train.metrics import ExportedModel
from tests.db import new_job

MODEL = ExportedModel(ExportFormat.torchscript, b"m", "0" * 64)


def point(step: int, loss: float) -> StepMetrics:
    return StepMetrics(step, 1, loss, 1e-3, 100.0, 0, 0, 0, 0.0)


def test_terminal_status_never_reverts(db: Database) -> None:
    job_id = new_job(db)
    with db.writer() as s:
        assert claim_job(s, job_id=job_id, worker="w", device="cpu") is not None
    with db.writer() as s:
        assert end_job(s, job_id=job_id, status=JobStatus.failed, code="x", message="y")
    with db.writer() as s:
        assert claim_job(s, job_id=job_id, worker="w2", device="cpu") is None
        assert not succeed_job(s, job_id=job_id, attempt=1, result={}, record={}, models=[MODEL])
        assert not end_job(s, job_id=job_id, status=JobStatus.canceled)
        assert request_cancel(s, job_id=job_id) is None
    with db.writer() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None and job.status == JobStatus.failed and job.worker == "w"


def test_a_rerun_epoch_replaces_its_steps(db: Database) -> None:
    job_id = new_job(db)
    with db.writer() as s:
        claim_job(s, job_id=job_id, worker="w", device="cpu")
    epoch = EpochMetrics(1, 3, 0.5, 0.9, 0.4, 0.9, 1.0, 100.0)
    for loss in (1.0, 2.0):
        with db.writer() as s:
            save_epoch(
                s,
                job_id=job_id,
                attempt=1,
                epoch=epoch,
                steps=[point(i, loss) for i in (1, 2, 3)],
                checkpoint=b"a",
            )
    with db.writer() as s:
        rows = step_metrics(s, job_id=job_id, after=0, limit=100)
        assert [(r.step, r.loss) for r in rows] == [(1, 2.0), (2, 2.0), (3, 2.0)]


def test_a_requeued_jobs_old_attempt_is_fenced_off(db: Database) -> None:
    job_id = new_job(db)
    with db.writer() as s:
        claim_job(s, job_id=job_id, worker="w1", device="cpu")
    silent = utcnow() + dt.timedelta(seconds=1)  # every beat so far is old enough
    with db.writer() as s:
        assert requeue_job(
            s, job_id=job_id, attempt=1, queue_entry=f"{job_id}-a2", silent_since=silent
        )
        assert not requeue_job(  # one winner
            s, job_id=job_id, attempt=1, queue_entry="again", silent_since=silent
        )
    with db.writer() as s:
        job = claim_job(s, job_id=job_id, worker="w2", device="cpu")
        assert job is not None and job.attempt == 2
    epoch = EpochMetrics(1, 1, 0.5, 0.9, 0.4, 0.9, 1.0, 100.0)
    with pytest.raises(JobSuperseded), db.writer() as s:
        save_epoch(s, job_id=job_id, attempt=1, epoch=epoch, steps=[point(1, 1.0)], checkpoint=None)
    with db.writer() as s:
        assert not succeed_job(s, job_id=job_id, attempt=1, result={}, record={}, models=[MODEL])
        assert heartbeat(s, job_id=job_id, attempt=2) is False


def test_an_artifacts_bytes_are_read_only_when_used(db: Database) -> None:
    """HEAD, 304 and predict's cache hits read an artifact's row, not its model: a model
    is loaded into memory only for a download's body or predict's load."""
    from sqlalchemy import inspect

    from core.store import get_artifact
    from tests.db import running_job

    job_id = running_job(db)
    model = ExportedModel(ExportFormat.onnx, b"x" * 4096, "1" * 64)
    with db.writer() as s:
        assert succeed_job(s, job_id=job_id, attempt=1, result={}, record={}, models=[model])
    with db.reader() as s:
        art = get_artifact(s, job_id=job_id, format=ExportFormat.onnx)
        assert art is not None and (art.sha256, art.size) == ("1" * 64, 4096)
        assert "data" in inspect(art).unloaded
        assert art.data == model.data  # loaded on first use, in the same session

"""Migration 0016 on both databases: the jobs stored before it are found by data set and
architecture and sorted by their final figures after it (read from their specs, results and
last epochs, however odd the spec); its downgrade refuses to lose a name, tag or note."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text

from core.db import Database, Job, utcnow
from core.labels import LabelsPatch
from core.schema import alembic_config, upgrade
from core.store.labels import relabel_job
from core.store.search import JobFilters, Scope, Sort, search_jobs
from tests.integration.conftest import database


def stored(db: Database, spec: object, status: str = "queued", result: object = None) -> str:
    """A job as the code of revision 0015 wrote it, in SQL."""
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        s.execute(
            text(
                "INSERT INTO jobs (id, owner, status, spec, result, request_hash, created_at, "
                "attempt, preemptions, progress_step, progress_epoch, cancel_requested, "
                "queue_entry, priority) VALUES (:id, 'o', :status, :spec, :result, :hash, :at, "
                "1, 0, 0, 0, false, :id, 0)"
            ),
            {
                "id": job_id,
                "status": status,
                "spec": json.dumps(spec),
                "result": None if result is None else json.dumps(result),
                "hash": "0" * 64,
                "at": utcnow(),
            },
        )
    return job_id


def epoch(db: Database, job_id: str, n: int, train_accuracy: float) -> None:
    with db.writer() as s:
        s.execute(
            text(
                "INSERT INTO epoch_metrics (job_id, epoch, step, train_loss, train_accuracy, "
                "test_loss, test_accuracy, duration_s, images_per_second) "
                "VALUES (:job, :n, :n, 0.1, :acc, 0.1, 0.9, 1.0, 10.0)"
            ),
            {"job": job_id, "n": n, "acc": train_accuracy},
        )


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_0016_reads_what_the_search_needs_from_the_jobs_before_it(
    kind: str, tmp_path: Path
) -> None:
    with database(kind, tmp_path) as url:
        upgrade(url, "0015")
        db = Database(url)
        try:
            result = {"test_accuracy": 0.97, "test_loss": 0.08, "train_loss": 0.1,
                      "images_per_second": 5000.0, "duration_s": 12.5, "epochs": 2}  # fmt: skip
            done = stored(db, {"dataset": "mnist", "model": "resnet18"}, "succeeded", result)
            epoch(db, done, 1, 0.5)
            epoch(db, done, 2, 0.96)
            older = stored(db, {"dataset": "mnist-sample"})  # before `model`: the cnn
            odd = stored(db, {"as_sent": [1, 2]})  # a raw spec from the queue
            scalar = stored(db, "not an object")
            long = stored(db, {"dataset": "d" * 80, "model": 7})
            upgrade(url)
            with db.reader() as s:
                rows = {j: s.get(Job, j) for j in (done, older, odd, scalar, long)}
                assert {j: (r.dataset, r.model) for j, r in rows.items() if r} == {
                    done: ("mnist", "resnet18"),
                    older: ("mnist-sample", "cnn"),
                    odd: (None, "cnn"),
                    scalar: (None, None),
                    long: ("d" * 64, None),
                }
                row = rows[done]
                assert row is not None
                figures = (row.final_test_accuracy, row.final_test_loss, row.final_train_loss,
                           row.final_images_per_second, row.final_duration_s,
                           row.final_train_accuracy)  # fmt: skip
                assert figures == (0.97, 0.08, 0.1, 5000.0, 12.5, 0.96)
                assert rows[older] is not None and rows[older].final_test_accuracy is None
                best = search_jobs(
                    s, scope=Scope("o", everyone=False), filters=JobFilters(model="resnet18"),
                    sort=Sort.parse("-test_accuracy"), after=None, limit=5,
                )  # fmt: skip
                assert [j.id for j in best] == [done]
            command.downgrade(alembic_config(url), "0015")  # nothing labelled: it goes
            upgrade(url)
            with db.writer() as s:
                relabel_job(s, job_id=older, patch=LabelsPatch(add_tags=("kept",)))
            with pytest.raises(RuntimeError, match=f"1 job.*tags or notes.*{older}"):
                command.downgrade(alembic_config(url), "0015")
            with db.reader() as s:
                assert s.get(Job, older).tags == ["kept"]  # type: ignore[union-attr]
        finally:
            db.dispose()


def test_0016_passes_over_a_result_sqlite_cannot_read_as_json(tmp_path: Path) -> None:
    """Python's json writes a non-finite figure as `Infinity`, which SQLite's JSON functions
    refuse: a job stored so before 0016 must not stop the upgrade; it is left without final
    figures (it sorts with the jobs that have none) and the rest are read as usual."""
    with database("sqlite", tmp_path) as url:
        upgrade(url, "0015")
        db = Database(url)
        try:
            odd = stored(db, {"dataset": "mnist"}, "succeeded", {"test_loss": float("inf")})
            nan_spec = stored(db, {"dataset": "mnist", "lr": float("nan")})
            done = stored(db, {"dataset": "mnist"}, "succeeded", {"test_accuracy": 0.9})
            upgrade(url)
            with db.reader() as s:
                rows = {j: s.get(Job, j) for j in (odd, nan_spec, done)}
                assert {j: (r.final_test_loss, r.final_test_accuracy, r.dataset)
                        for j, r in rows.items() if r} == {
                    odd: (None, None, "mnist"),
                    nan_spec: (None, None, None),
                    done: (None, 0.9, "mnist"),
                }  # fmt: skip
        finally:
            db.dispose()

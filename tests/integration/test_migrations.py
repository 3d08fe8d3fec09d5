"""The schema changes only through Alembic: head must match the models exactly, and each
migration that moves data keeps it."""

from __future__ import annotations

import datetime as dt
import gc
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import func, inspect, select, text, update
from sqlalchemy.exc import IntegrityError

from core.db import Artifact, AttemptTime, Base, Database, Job, make_engine, utcnow
from core.quotas import usage
from core.schema import alembic_config, schema_problem, upgrade
from tests.integration.conftest import database
from tests.service import REPO


def old_job(db: Database) -> str:
    """A queued job written as an older revision's code would, in SQL: the ORM writes
    today's columns."""
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        s.execute(
            text(
                "INSERT INTO jobs (id, owner, status, spec, request_hash, created_at, attempt, "
                "preemptions, progress_step, progress_epoch, cancel_requested, queue_entry) "
                "VALUES (:id, 'o', 'queued', '{}', :hash, :at, 0, 0, 0, 0, false, :id)"
            ),
            {"id": job_id, "hash": "0" * 64, "at": utcnow()},
        )
    return job_id


def test_migrations_reach_the_models(database_url: str) -> None:
    upgrade(database_url)
    upgrade(database_url)  # idempotent
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
            tables = set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    assert diff == []
    assert {"jobs", "epoch_metrics", "step_metrics", "checkpoints", "artifacts"} <= tables


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_0006_keeps_a_stored_torchscript_model_and_takes_more_formats(
    kind: str, tmp_path: Path
) -> None:
    with database(kind, tmp_path) as url:
        upgrade(url, "0005")
        db = Database(url)
        try:
            job_id = old_job(db)
            with db.writer() as s:
                s.execute(
                    text(
                        "INSERT INTO artifacts (job_id, kind, data, sha256, size, created_at) "
                        "VALUES (:job_id, 'torchscript', :data, :sha, 3, :at)"
                    ),
                    {"job_id": job_id, "data": b"pt!", "sha": "a" * 64, "at": utcnow()},
                )
            upgrade(url)
            with db.writer() as s:
                stored = s.get(Artifact, (job_id, "torchscript"))
                assert stored is not None
                assert (stored.data, stored.sha256, stored.size) == (b"pt!", "a" * 64, 3)
                s.add(Artifact(job_id=job_id, format="onnx", data=b"o", sha256="b" * 64, size=1))
            with db.writer() as s:
                formats = s.scalars(select(Artifact.format).where(Artifact.job_id == job_id))
                assert sorted(formats) == ["onnx", "torchscript"]
                s.add(Artifact(job_id=job_id, format="onnx", data=b"o", sha256="b" * 64, size=1))
                with pytest.raises(IntegrityError):
                    s.flush()  # one row per (job, format)
            command.downgrade(alembic_config(url), "0005")  # TorchScript alone stays
            with db.writer() as s:
                rows = s.execute(text("SELECT job_id, kind, data FROM artifacts")).all()
                assert [tuple(r) for r in rows] == [(job_id, "torchscript", b"pt!")]
        finally:
            db.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_0006_refuses_to_downgrade_a_job_it_would_leave_without_a_model(
    kind: str, tmp_path: Path
) -> None:
    with database(kind, tmp_path) as url:
        upgrade(url)
        db = Database(url)
        try:
            job_id = old_job(db)
            with db.writer() as s:
                s.add(Artifact(job_id=job_id, format="onnx", data=b"o", sha256="b" * 64, size=1))
            with pytest.raises(RuntimeError, match=f"1 job.*no TorchScript.*{job_id}"):
                command.downgrade(alembic_config(url), "0005")
            with db.writer() as s:  # nothing was taken
                assert s.get(Artifact, (job_id, "onnx")) is not None
        finally:
            db.dispose()
        gc.collect()  # a connection the refused migration left open would warn here


def job_that_ran(db: Database, status: str, **hours_ago: float) -> str:
    """A job as an older revision left it, whose times are `hours_ago` (started_at,
    finished_at, enqueued_at) hours before now."""
    job_id = old_job(db)
    now = utcnow()
    times = {k: now - dt.timedelta(hours=h) for k, h in hours_ago.items()}
    with db.writer() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status=status, attempt=1, **times))
    return job_id


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_0011_keeps_the_training_hours_of_the_jobs_before_it(kind: str, tmp_path: Path) -> None:
    """The upgrade copies each job's latest attempt into attempt_times, so the hours its
    owner's quota counted before it count after it; the downgrade drops the table."""
    with database(kind, tmp_path) as url:
        upgrade(url, "0010")
        db = Database(url)
        try:
            job_that_ran(db, "succeeded", started_at=3, finished_at=1, enqueued_at=3.1)
            job_that_ran(db, "running", started_at=0.5, enqueued_at=0.6)
            job_that_ran(db, "queued", started_at=5, enqueued_at=4)  # requeued 4 h ago
            job_that_ran(db, "failed", started_at=30, finished_at=23.5, enqueued_at=31)
            job_that_ran(db, "failed", started_at=80, finished_at=79, enqueued_at=81)
            old_job(db)  # never started
            upgrade(url)
            with db.reader() as s:
                hours = usage(s, "o").train_hours_24h
                assert hours == pytest.approx(2 + 0.5 + 1 + 0.5, abs=0.01)
                assert s.scalar(select(func.count()).select_from(AttemptTime)) == 4
            command.downgrade(alembic_config(url), "0010")
            with db.reader() as s:
                assert "attempt_times" not in inspect(s.connection()).get_table_names()
                assert s.scalar(select(func.count()).select_from(Job)) == 6
            upgrade(url)
        finally:
            db.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_migrations_at_once_both_reach_head(kind: str, tmp_path: Path) -> None:
    """Deployments run `trainq migrate` from every replica as it starts: on a fresh database
    each must wait for the one that runs, then find it at head, never fail half-way."""
    with database(kind, tmp_path) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
        env.update(TRAINQ_DATABASE_URL=url, TRAINQ_DATA_DIR=str(tmp_path))
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "cli", "migrate"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for _ in range(3)
        ]
        outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(outputs)
        head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                assert MigrationContext.configure(conn).get_current_revision() == head
        finally:
            engine.dispose()


def test_a_database_migrated_past_this_trainq_is_named_newer(tmp_path: Path) -> None:
    """What `trainq serve`, `trainq worker` and the launcher's restarts say of a database
    that a newer trainq migrated: not "run trainq migrate", which could not help."""
    url = f"sqlite:///{tmp_path / 'trainq.db'}"
    upgrade(url)
    assert schema_problem(url) is None
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    finally:
        engine.dispose()
    problem = schema_problem(url)
    assert problem is not None and "9999, newer than this trainq knows" in problem

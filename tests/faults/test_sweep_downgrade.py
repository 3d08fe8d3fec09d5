"""Downgrading below 0010 with sweeps present: the schema before it knows no `pruned`
status and no sweeps. A downgrade must either refuse (as 0006's does when it would strand
data) or leave rows the older code can read; it must not leave jobs in a status that the
0009 code's JobStatus cannot parse."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text

from core.db import Database, utcnow
from core.schema import alembic_config, upgrade
from tests.integration.conftest import database

# What revision 0009's code knows (core.spec.JobStatus before the sweeps commit).
STATUSES_0009 = {"queued", "running", "succeeded", "failed", "canceled"}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_downgrading_0010_with_a_pruned_trial(kind: str, tmp_path: Path) -> None:
    with database(kind, tmp_path) as url:
        upgrade(url)
        db = Database(url)
        sweep_id, job_id = str(uuid.uuid4()), str(uuid.uuid4())
        try:
            with db.writer() as s:
                s.execute(
                    text(
                        "INSERT INTO sweeps (id, owner, spec, status, trials_created, created_at)"
                        " VALUES (:id, 'o', '{}', 'running', 1, :at)"
                    ),
                    {"id": sweep_id, "at": utcnow()},
                )
                s.execute(
                    text(
                        "INSERT INTO jobs (id, owner, status, spec, request_hash, created_at, "
                        "attempt, preemptions, progress_step, progress_epoch, cancel_requested, "
                        "queue_entry, sweep_id, trial_number) VALUES (:id, 'o', 'pruned', '{}',"
                        " :hash, :at, 1, 0, 0, 0, false, :id, :sweep, 0)"
                    ),
                    {"id": job_id, "hash": "0" * 64, "at": utcnow(), "sweep": sweep_id},
                )
        finally:
            db.dispose()
        refused = False
        try:
            command.downgrade(alembic_config(url), "0009")
        except Exception:
            refused = True
        if refused:
            return  # refusing, naming what it would strand, is a fine answer
        db = Database(url)
        try:
            with db.reader() as s:
                statuses = set(s.scalars(text("SELECT DISTINCT status FROM jobs")))
        finally:
            db.dispose()
        assert statuses <= STATUSES_0009, (
            f"downgrade to 0009 left jobs in {statuses - STATUSES_0009}: the 0009 code's "
            "JobStatus cannot read them (and the sweeps table went without a word)"
        )

"""A job's life as declared (core.store.lifecycle): every transition in TRANSITIONS is made
by `move`, its guards hold in its UPDATE, a move the table does not declare raises, and no
write of jobs.status goes around `move`. SQLite and PostgreSQL."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select

from core.db import Database, Job, db_ago
from core.spec import ExportFormat, JobStatus
from core.store import (
    claim_job,
    end_job,
    get_job,
    lifecycle,
    preempt_job,
    request_cancel,
    requeue_job,
    retry_job,
    succeed_job,
)
from core.store.lifecycle import TRANSITIONS, Guard, IllegalMove, move
from core.train.metrics import ExportedModel
from tests.db import new_job, running_job

ROOT = Path(__file__).resolve().parents[2]
SET_STATUS = re.compile(r"^\s*UPDATE jobs SET (?:.*?[\s,])?status\s*=", re.IGNORECASE | re.DOTALL)
DECLARED = [(src, to) for to, t in TRANSITIONS.items() for src in sorted(t.sources)]
MODEL = ExportedModel(ExportFormat.torchscript, b"m", "0" * 64)


def job_at(db: Database, status: JobStatus) -> str:
    if status is JobStatus.queued:
        return new_job(db)
    if status is JobStatus.running:
        return running_job(db)
    raise AssertionError(f"no declared move starts at {status}")


def status_of(db: Database, job_id: str) -> tuple[str, int]:
    with db.reader() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None
        return job.status, job.attempt


@pytest.mark.parametrize(("source", "to"), DECLARED)
def test_every_declared_move_is_made_by_move(
    db: Database, source: JobStatus, to: JobStatus
) -> None:
    job_id = job_at(db, source)
    needs: dict[str, Any] = {"attempt": 1} if Guard.attempt in TRANSITIONS[to].needs else {}
    with db.writer() as s:
        assert move(s, job_id, to, sources=[source], **needs)
        assert not move(s, job_id, to, sources=[source], **needs)  # compare-and-set: once
    assert status_of(db, job_id)[0] == to


@pytest.mark.parametrize(("source", "to"), DECLARED)
def test_each_guard_is_in_the_update(db: Database, source: JobStatus, to: JobStatus) -> None:
    """A guard that does not hold leaves the row as it was."""
    allowed = TRANSITIONS[to].guards
    wrong = {
        Guard.attempt: {"attempt": 7},
        Guard.silent: {"silent_since": db_ago(3600), "attempt": 1},
        Guard.entry: {"entry": "another-entry"},
    }
    for guard in sorted(allowed):
        job_id = job_at(db, source)
        before = status_of(db, job_id)
        with db.writer() as s:
            assert not move(s, job_id, to, sources=[source], **wrong[guard])
        assert status_of(db, job_id) == before


@pytest.mark.parametrize("source", list(JobStatus))
@pytest.mark.parametrize("to", list(JobStatus))
def test_a_move_not_declared_raises(db: Database, source: JobStatus, to: JobStatus) -> None:
    if (source, to) in DECLARED:
        return
    with db.writer() as s, pytest.raises(IllegalMove):
        move(s, "no-such-job", to, sources=[source])


def test_a_guard_the_move_does_not_take_or_needs_raises(db: Database) -> None:
    job_id = running_job(db)
    with db.writer() as s:
        with pytest.raises(IllegalMove):
            move(s, job_id, JobStatus.failed, entry=job_id)  # a claim's guard
        with pytest.raises(IllegalMove):
            move(s, job_id, JobStatus.queued, queue_entry="x")  # whose attempt hands it back?
        with pytest.raises(IllegalMove):
            move(s, job_id, JobStatus.pruned)
    assert status_of(db, job_id) == ("running", 1)


@pytest.fixture
def status_writes(db: Database) -> Iterator[list[str]]:
    """Every UPDATE that sets jobs.status while the test runs; each asserted to come from
    lifecycle.move (a frame of it on the stack)."""
    seen: list[str] = []

    def audit(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not SET_STATUS.match(statement):
            return
        frame = sys._getframe()
        while frame is not None and frame.f_code is not move.__code__:
            frame = frame.f_back  # type: ignore[assignment]
        assert frame is not None, f"jobs.status written around lifecycle.move: {statement}"
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", audit)
    yield seen
    event.remove(db.engine, "before_cursor_execute", audit)


def test_every_status_write_of_the_store_goes_through_move(
    db: Database, status_writes: list[str]
) -> None:
    job_id = new_job(db)
    ahead = db_ago(-3600)  # an hour from now: every attempt counts as silent
    with db.writer() as s:
        assert claim_job(s, job_id=job_id, worker="w", device="cpu", queue_entry=job_id)
        assert preempt_job(
            s, job_id=job_id, attempt=1, epoch=1, step=2, steps=[], checkpoint=b"c",
            queue_entry=f"{job_id}-p1",
        )  # fmt: skip
        assert claim_job(s, job_id=job_id, worker="w", device="cpu")
        assert retry_job(s, job_id=job_id, attempt=2, queue_entry=f"{job_id}-r2")
        assert claim_job(s, job_id=job_id, worker="w", device="cpu")
        assert requeue_job(
            s, job_id=job_id, attempt=3, queue_entry=f"{job_id}-a4", silent_since=ahead
        )
        assert claim_job(s, job_id=job_id, worker="w", device="cpu")
        assert succeed_job(s, job_id=job_id, attempt=4, result={}, record={}, models=[MODEL])
    ends = [JobStatus.failed, JobStatus.canceled, JobStatus.pruned]
    for status in ends:
        other = running_job(db)
        with db.writer() as s:
            assert request_cancel(s, job_id=other) is JobStatus.running  # a flag, no move
            assert end_job(
                s, job_id=other, status=status, from_statuses=(JobStatus.running,), attempt=1
            )
    canceled, failed = new_job(db), new_job(db)
    with db.writer() as s:
        assert request_cancel(s, job_id=canceled) is JobStatus.canceled
        assert end_job(s, job_id=failed, status=JobStatus.failed, code="x", message="y")
        statuses = dict(s.execute(select(Job.id, Job.status).where(Job.id == job_id)).all())
    assert statuses == {job_id: JobStatus.succeeded}
    # 8 above; a claim, a cancel tried on a queued job and an end for each of `ends`; 2 here
    assert len(status_writes) == 8 + 3 * len(ends) + 2


def test_the_audit_sees_a_write_around_move(db: Database, status_writes: list[str]) -> None:
    """The audit above can fail: a status written straight, as the ORM would, is caught."""
    job_id = new_job(db)
    with pytest.raises(AssertionError, match=r"around lifecycle\.move"), db.writer() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None
        job.status = JobStatus.canceled
        s.flush()
    assert status_writes == []


def status_writes_in(tree: ast.AST) -> Iterator[int]:
    """Lines that set a `status` attribute, or pass `status=` to `.values(...)` of a
    statement over Job (a Sweep's status, or a webhook delivery's, is not a job's)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets):
                yield node.lineno
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "values"
            and any(k.arg == "status" for k in node.keywords)
            and not any(t in ast.unparse(node.func.value) for t in ("Sweep", "WebhookDelivery"))
        ):
            yield node.lineno


def test_no_module_writes_a_status_outside_the_lifecycle() -> None:
    own = Path(lifecycle.__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in ("core", "worker", "api", "cli")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.resolve() != own
        for line in status_writes_in(ast.parse(path.read_text()))
    ]
    assert found == []


def test_the_source_scan_can_fail() -> None:
    bypass = "s.execute(update(Job).where(Job.id == i).values(status=JobStatus.failed))"
    assert list(status_writes_in(ast.parse(bypass))) == [1]
    assert list(status_writes_in(ast.parse("job.status = JobStatus.failed"))) == [1]
    assert list(status_writes_in(ast.parse("update(Sweep).values(status=s)"))) == []

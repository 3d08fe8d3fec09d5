"""The model registry's store (core.store.registry) on SQLite and PostgreSQL, driven from
threads at once: version numbers given once each, two alias moves at once applied in turn
(or the second refused when it said where it expected the alias), and a registered job's
model kept through retention, `trainq gc` and deletion, also when they race a
registration."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError

from core.db import AliasMove, Artifact, Database, Job, Model, ModelAlias, ModelVersion, utcnow
from core.errors import (
    AliasChanged,
    InvalidRequest,
    JobRegistered,
    ModelPurged,
    NoModel,
    NotFound,
    VersionInUse,
)
from core.retention import collect, purge_batch, purge_job
from core.spec import JobSpec
from core.store import new_job
from core.store.deletion import delete_ended_job
from core.store.registry import NOWHERE, delete_version, move_alias, register_job
from core.store.registry_reads import alias_history, get_model, version_for_alias
from tests.db import migrated
from tests.service import REPO

SPEC = {"epochs": 1, "max_steps": 3, "export": ["torchscript", "onnx"]}
ROUNDS = 20


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    from tests.integration.conftest import database

    with database(request.param, tmp_path) as url, migrated(url) as db:
        yield db


def succeeded_job(db: Database, *, days_ago: float = 0, status: str = "succeeded") -> str:
    """A job that ended `days_ago` days ago with a TorchScript and an ONNX model, its run
    record and result as a worker writes them."""
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        job = new_job(job_id=job_id, spec=JobSpec(**SPEC), owner="o", idempotency_key=None)
        job.status = status
        job.finished_at = utcnow() - dt.timedelta(days=days_ago)
        job.result = {"test_accuracy": 0.9, "test_loss": 0.3}
        job.record = {"dataset": {"name": "mnist-sample", "sha256": "d" * 64,
                                  "classes": [str(i) for i in range(10)]}}  # fmt: skip
        s.add(job)
        s.flush()
        for fmt in ("torchscript", "onnx"):
            data = os.urandom(100)
            s.add(Artifact(job_id=job_id, format=fmt, data=data, size=len(data),
                           sha256=hashlib.sha256(data).hexdigest()))  # fmt: skip
    return job_id


def register(db: Database, job_id: str, name: str = "digits") -> int:
    with db.writer() as s:
        return register_job(
            s, owner="o", name=name, job_id=job_id, registered_by="o"
        ).version.version


def model_id(db: Database, name: str = "digits") -> int:
    with db.reader() as s:
        model = get_model(s, owner="o", name=name)
        assert model is not None
        return model.id


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Each call's result (or the exception it raised), all started at the same moment."""
    results: list[Any] = [None] * len(calls)
    go = threading.Barrier(len(calls))

    def run(i: int) -> None:
        go.wait()
        try:
            results[i] = calls[i]()
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# -- versions ---------------------------------------------------------------------------


def test_registrations_at_once_each_get_their_own_number(fresh_db: Database) -> None:
    """Eight registrations into a model that none of them finds: one model is made, and
    each job gets one of 1..8; the same job registered again is the same version."""
    jobs = [succeeded_job(fresh_db) for _ in range(8)]
    got = at_once(*(lambda j=j: register(fresh_db, j) for j in jobs))
    assert sorted(got) == list(range(1, 9)), got
    with fresh_db.reader() as s:
        assert s.scalar(select(func.count()).select_from(Model)) == 1
    again = at_once(lambda: register(fresh_db, jobs[0]), lambda: register(fresh_db, jobs[0]))
    assert again == [got[0], got[0]]


def test_registering_what_has_no_model_is_refused_and_writes_nothing(fresh_db: Database) -> None:
    failed = succeeded_job(fresh_db, status="failed")
    with pytest.raises(NoModel, match="failed: only a succeeded job"):
        register(fresh_db, failed)
    empty = succeeded_job(fresh_db)
    with fresh_db.writer() as s:
        s.execute(delete(Artifact).where(Artifact.job_id == empty))
    with pytest.raises(NoModel, match="stored no model"):
        register(fresh_db, empty)
    old = succeeded_job(fresh_db, days_ago=10)
    with fresh_db.writer() as s:
        assert purge_job(s, job_id=old)
    with pytest.raises(ModelPurged, match="retention"):
        register(fresh_db, old)
    with fresh_db.reader() as s:  # no model was made for any of them
        assert s.scalar(select(func.count()).select_from(Model)) == 0


def test_a_version_keeps_its_lineage(fresh_db: Database) -> None:
    job_id = succeeded_job(fresh_db)
    register(fresh_db, job_id)
    with fresh_db.reader() as s:
        v = s.get(ModelVersion, (model_id(fresh_db), 1))
        assert v is not None
        assert (v.job_id, v.dataset, v.dataset_sha256) == (job_id, "mnist-sample", "d" * 64)
        assert v.spec["max_steps"] == 3 and v.metrics == {"test_accuracy": 0.9, "test_loss": 0.3}
        assert v.classes == [str(i) for i in range(10)]
        assert [f["format"] for f in v.formats] == ["torchscript", "onnx"]
        stored = s.get(Artifact, (job_id, "onnx"))
        assert stored is not None and v.formats[1]["sha256"] == stored.sha256


# -- aliases ----------------------------------------------------------------------------


def three_versions(db: Database) -> int:
    for _ in range(3):
        register(db, succeeded_job(db))
    return model_id(db)


def move(db: Database, mid: int, to: int | None, expected: int | None = None, by: str = "o") -> Any:
    with db.writer() as s:
        return move_alias(
            s, model_id=mid, alias="production", to_version=to, moved_by=by, expected=expected
        )


def test_two_promotions_that_expect_the_same_version_one_wins(fresh_db: Database) -> None:
    """Both say the alias is at 1 and move it, one to 2, one to 3, at the same moment: one
    moves it, the other is refused (AliasChanged) and changes nothing."""
    mid = three_versions(fresh_db)
    for _ in range(ROUNDS):
        move(fresh_db, mid, 1)
        results = at_once(lambda: move(fresh_db, mid, 2, 1), lambda: move(fresh_db, mid, 3, 1))
        refused = [r for r in results if isinstance(r, AliasChanged)]
        won = [r for r in results if not isinstance(r, Exception)]
        assert len(refused) == 1 and len(won) == 1, results
        with fresh_db.reader() as s:
            now = version_for_alias(s, model_id=mid, alias="production")
            assert now is not None and now.version == won[0].to_version
            assert alias_history(s, model_id=mid, alias="production", limit=1)[0].to_version == (
                won[0].to_version
            )


def test_promotions_without_a_precondition_apply_one_after_the_other(
    fresh_db: Database,
) -> None:
    """Moves that say nothing of where the alias was all apply, in some order: the history
    is one chain (each move starts where the one before ended) and ends where the alias
    points."""
    mid = three_versions(fresh_db)
    move(fresh_db, mid, 1, NOWHERE)
    for _ in range(ROUNDS // 2):
        results = at_once(*(lambda v=v: move(fresh_db, mid, v, by=f"k{v}") for v in (2, 3, 1, 2)))
        assert not [r for r in results if isinstance(r, Exception)], results
    with fresh_db.reader() as s:
        history = list(reversed(alias_history(s, model_id=mid, alias="production", limit=1000)))
        now = version_for_alias(s, model_id=mid, alias="production")
    assert history[0].from_version is None and history[0].to_version == 1
    for before, after in itertools.pairwise(history):
        assert after.from_version == before.to_version, [
            (h.from_version, h.to_version) for h in history
        ]
    assert now is not None and history[-1].to_version == now.version


def test_an_alias_moves_removes_and_refuses_what_is_not_there(fresh_db: Database) -> None:
    mid = three_versions(fresh_db)
    first = move(fresh_db, mid, 2, NOWHERE)
    assert (first.from_version, first.to_version, first.moved) == (None, 2, True)
    with pytest.raises(AliasChanged, match="points at version 2, not 0"):
        move(fresh_db, mid, 3, NOWHERE)
    assert not move(fresh_db, mid, 2).moved  # already there: no move, no history
    with pytest.raises(InvalidRequest) as unknown:
        move(fresh_db, mid, 9)
    assert unknown.value.problems[0]["loc"] == ["body", "version"]
    with pytest.raises(VersionInUse, match="production"), fresh_db.writer() as s:
        delete_version(s, model_id=mid, version=2)
    assert move(fresh_db, mid, None).to_version is None
    with fresh_db.reader() as s:
        assert s.get(ModelAlias, (mid, "production")) is None
        rows = s.execute(
            select(AliasMove.from_version, AliasMove.to_version).order_by(AliasMove.id)
        ).all()
    assert [tuple(r) for r in rows] == [(None, 2), (2, None)]
    with fresh_db.writer() as s:
        delete_version(s, model_id=mid, version=2)  # nothing points at it now


def test_an_alias_move_tells_the_owners_webhooks_once_in_its_transaction(
    fresh_db: Database,
) -> None:
    """model.alias_moved is written by the move itself: once per move that changed the
    alias, none for a move to where it already is, none for one refused."""
    from core.webhooks.endpoints import create_endpoint
    from tests.integration.test_webhook_outbox import events_to

    mid = three_versions(fresh_db)
    with fresh_db.writer() as s:
        hook = create_endpoint(s, owner="o", url="https://hooks.example/x",
                               events=["model.alias_moved"], description=None).id  # fmt: skip
    move(fresh_db, mid, 2, NOWHERE)
    assert not move(fresh_db, mid, 2).moved
    with pytest.raises(AliasChanged):
        move(fresh_db, mid, 3, 1)
    move(fresh_db, mid, 3, by="k_b")
    events = events_to(fresh_db, hook)
    assert [e["type"] for e in events] == ["model.alias_moved"] * 2
    assert [(e["data"]["from_version"], e["data"]["to_version"]) for e in events] == [
        (None, 2),
        (2, 3),
    ]
    assert events[1]["data"]["model"] == "digits" and events[1]["data"]["moved_by"] == "k_b"


def test_moves_at_once_are_numbered_in_the_order_they_applied(fresh_db: Database) -> None:
    """Each model.alias_moved carries the model's `sequence`, given in the move's own
    transaction: moves of two aliases made at once get distinct numbers, 1, 2, 3 ... with
    no gap, in the order they applied (sorted by it, each alias's moves are one chain), so a
    receiver that gets them out of order can put them back, and drop one it has seen."""
    from core.webhooks.endpoints import create_endpoint
    from tests.integration.test_webhook_outbox import events_to

    mid = three_versions(fresh_db)
    with fresh_db.writer() as s:
        hook = create_endpoint(s, owner="o", url="https://hooks.example/x",
                               events=["model.alias_moved"], description=None).id  # fmt: skip

    def moving(alias: str, to: int) -> Callable[[], Any]:
        def run() -> Any:
            with fresh_db.writer() as s:
                return move_alias(s, model_id=mid, alias=alias, to_version=to, moved_by="o")

        return run

    for _ in range(ROUNDS // 4):
        results = at_once(*(moving(a, v) for a in ("production", "staging") for v in (1, 2, 3)))
        assert not [r for r in results if isinstance(r, Exception)], results
    events = sorted(events_to(fresh_db, hook), key=lambda e: e["data"]["sequence"])
    assert [e["data"]["sequence"] for e in events] == list(range(1, len(events) + 1))
    for alias in ("production", "staging"):
        moves = [e["data"] for e in events if e["data"]["alias"] == alias]
        assert moves[0]["from_version"] is None
        for before, after in itertools.pairwise(moves):
            assert after["from_version"] == before["to_version"], moves


# -- retention, gc, deletion --------------------------------------------------------------


def purged(db: Database, job_id: str) -> bool:
    with db.reader() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.purged_at is not None


def artifacts(db: Database, job_id: str) -> int:
    with db.reader() as s:
        return s.scalar(select(func.count()).where(Artifact.job_id == job_id)) or 0


def gc(db: Database, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env["TRAINQ_DATABASE_URL"] = str(db.engine.url.render_as_string(hide_password=False))
    return subprocess.run(
        [sys.executable, "-m", "cli", "gc", *args],
        cwd=REPO, env=env, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip


@pytest.mark.slow
def test_retention_and_gc_keep_a_registered_jobs_model(fresh_db: Database) -> None:
    kept = succeeded_job(fresh_db, days_ago=40)
    other = succeeded_job(fresh_db, days_ago=40)
    register(fresh_db, kept)
    assert purge_batch(fresh_db, older_than_days=30, limit=10).jobs == 1
    assert purged(fresh_db, other) and not purged(fresh_db, kept)
    with fresh_db.writer() as s:  # asked by id, as a pass that listed it before would
        assert not purge_job(s, job_id=kept)
    assert "would purge 0 jobs" in gc(fresh_db, "--dry-run", "--older-than-days", "30")
    out = gc(fresh_db, "--older-than-days", "30")
    assert "purged 0 jobs" in out and "kept 1 jobs as old whose models are registered" in out
    assert not purged(fresh_db, kept) and artifacts(fresh_db, kept) == 2
    with fresh_db.writer() as s:
        delete_version(s, model_id=model_id(fresh_db), version=1)
    assert collect(fresh_db, older_than_days=30).jobs == 1  # no longer a version: it goes
    assert purged(fresh_db, kept) and artifacts(fresh_db, kept) == 0


def test_a_registered_job_cannot_be_deleted(fresh_db: Database) -> None:
    job_id = succeeded_job(fresh_db)
    register(fresh_db, job_id)
    with pytest.raises(JobRegistered), fresh_db.writer() as s:
        delete_ended_job(s, job_id=job_id)
    assert artifacts(fresh_db, job_id) == 2
    # The database refuses it too, whoever deletes the row.
    with pytest.raises(IntegrityError), fresh_db.writer() as s:
        s.execute(delete(Artifact).where(Artifact.job_id == job_id))
        s.execute(delete(Job).where(Job.id == job_id))
    assert artifacts(fresh_db, job_id) == 2


def settles(results: list[Any], kinds: tuple[type[Exception], ...]) -> None:
    unexpected = [r for r in results if isinstance(r, Exception) and not isinstance(r, kinds)]
    assert not unexpected, unexpected


def test_a_purge_racing_a_registration_never_leaves_a_version_without_its_model(
    fresh_db: Database,
) -> None:
    """Either the registration came first (the job is kept whole) or the purge did (the
    registration is refused, 410): never a version whose model was purged."""
    outcomes = set()
    for _ in range(ROUNDS):
        job_id = succeeded_job(fresh_db, days_ago=40)

        def purge(job_id: str = job_id) -> bool:
            with fresh_db.writer() as s:
                return purge_job(s, job_id=job_id)

        results = at_once(purge, lambda j=job_id: register(fresh_db, j, "raced"))
        settles(results, (ModelPurged,))
        gone, version = results
        with fresh_db.reader() as s:
            versions = s.scalar(select(func.count()).where(ModelVersion.job_id == job_id))
        if gone is True:
            assert isinstance(version, ModelPurged) and versions == 0
        else:
            assert isinstance(version, int) and artifacts(fresh_db, job_id) == 2
        outcomes.add(gone)
    print("purge won:", outcomes)


def test_a_deletion_racing_a_registration_is_refused_or_refuses_it(fresh_db: Database) -> None:
    """Either the job is deleted and the registration finds no job (404), or the job is
    registered and its deletion is refused (409): never a 500, never a version without its
    job."""
    for _ in range(ROUNDS):
        job_id = succeeded_job(fresh_db)

        def remove(job_id: str = job_id) -> bool:
            with fresh_db.writer() as s:
                return delete_ended_job(s, job_id=job_id)

        results = at_once(remove, lambda j=job_id: register(fresh_db, j, "raced"))
        settles(results, (JobRegistered, NotFound))
        deleted, version = results
        assert (deleted is True and isinstance(version, NotFound)) or (
            isinstance(deleted, JobRegistered) and isinstance(version, int)
        ), results

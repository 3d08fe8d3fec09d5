"""A sweep's trials in the database (core.sweeps.trials), on SQLite and PostgreSQL: the
first trials, the next one when one ends and never more, the same answer after a top-up
that was lost, racing deciders, the end of the budget, the pruner's verdict kept with the
trial, cancel, and quotas."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import select, update

from core.config import Settings
from core.db import Database, EpochMetric, Job, Quota, Sweep
from core.errors import QuotaExceeded
from core.spec import JobSpec, JobStatus
from core.store import claim_job, end_job
from core.store.sweeps import SweepStatus, set_trial_attrs
from core.sweeps import trials
from core.sweeps.search import Verdict
from core.sweeps.spec import SweepSpec

SPACE = {"lr": {"log_uniform": [1e-4, 1e-2]}, "batch_size": {"choice": [32, 64, 128]}}


@pytest.fixture
def settings() -> Settings:
    return Settings()


def sweep_of(db: Database, settings: Settings, **fields: object) -> tuple[str, list[Job]]:
    spec = SweepSpec.model_validate({"space": SPACE, "trials": 5, "parallel": 2, **fields})
    with db.writer() as s:
        sweep, first = trials.create(
            s, settings, spec=spec, owner="o", quota_owner=None, idempotency_key=None
        )
    return sweep.id, first


def in_db(db: Database, sweep_id: str) -> list[Job]:
    with db.reader() as s:
        return list(s.scalars(select(Job).where(Job.sweep_id == sweep_id)))


def finish(db: Database, job_id: str, values: list[float], status: JobStatus) -> None:
    """The trial ran as a worker runs it: each epoch stored with test_accuracy `values` and
    judged (what the pruner keeps is stored with the trial), then its end."""
    with db.writer() as s:
        claim_job(s, job_id=job_id, worker="w", device="cpu")
    for epoch, v in enumerate(values, 1):
        judge(db, job_id, epoch, v)
    with db.writer() as s:
        end_job(s, job_id=job_id, status=status, code=None if status == "succeeded" else "x")


def judge(db: Database, job_id: str, epoch: int, accuracy: float) -> tuple[Verdict, str] | None:
    """What the worker does at a trial's epoch end: judge from a read, then store the epoch
    with what the pruner keeps on the trial."""
    row = epoch_row(job_id, epoch, accuracy)
    with db.reader() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.sweep_id is not None and job.trial_number is not None
        judged = trials.judge_epoch(
            s, sweep_id=job.sweep_id, number=job.trial_number, epoch=epoch, metrics=row
        )
    with db.writer() as s:
        s.add(row)
        if judged is not None:
            set_trial_attrs(s, job_id=job_id, attrs=judged[0].attrs)
    return judged


def epoch_row(job_id: str, epoch: int, accuracy: float) -> EpochMetric:
    return EpochMetric(
        job_id=job_id, epoch=epoch, step=epoch * 10, train_loss=1 - accuracy,
        train_accuracy=accuracy, test_loss=1 - accuracy, test_accuracy=accuracy,
        duration_s=1.0, images_per_second=1.0,
    )  # fmt: skip


def top_up(db: Database, settings: Settings, sweep_id: str) -> list[Job]:
    with db.writer() as s:
        return trials.top_up(s, settings, sweep_id=sweep_id)


def test_first_trials_are_jobs_of_the_space(db: Database, settings: Settings) -> None:
    sweep_id, first = sweep_of(db, settings, base={"epochs": 3, "export": ["torchscript"]})
    assert [j.trial_number for j in first] == [0, 1]
    rows = in_db(db, sweep_id)
    assert [r.status for r in rows] == ["queued", "queued"]
    for row in rows:
        spec = JobSpec.model_validate(row.spec)
        assert 1e-4 <= spec.lr <= 1e-2 and spec.batch_size in (32, 64, 128)
        assert spec.epochs == 3 and row.owner == "o" and row.queue_entry == row.id
        assert row.trial_params == {"lr": spec.lr, "batch_size": spec.batch_size}
    # Nothing ended: nothing more, however often it is asked.
    assert top_up(db, settings, sweep_id) == [] and top_up(db, settings, sweep_id) == []
    assert len(in_db(db, sweep_id)) == 2


def test_a_trial_that_ends_makes_room_for_exactly_one(db: Database, settings: Settings) -> None:
    sweep_id, first = sweep_of(db, settings)
    finish(db, first[0].id, [0.5, 0.6], JobStatus.succeeded)
    made = top_up(db, settings, sweep_id)
    assert [j.trial_number for j in made] == [2]
    assert top_up(db, settings, sweep_id) == []
    assert sorted(j.trial_number for j in in_db(db, sweep_id)) == [0, 1, 2]


def test_a_lost_top_up_asks_again_and_gets_the_same_trial(db: Database, settings: Settings) -> None:
    """A crash before the commit: the next decider makes the trial the lost one would have."""
    sweep_id, first = sweep_of(db, settings)
    finish(db, first[0].id, [0.5], JobStatus.succeeded)
    with db.manual_session() as s:
        lost = trials.top_up(s, settings, sweep_id=sweep_id)
        lost_params = [j.trial_params for j in lost]
        s.rollback()
    again = top_up(db, settings, sweep_id)
    assert [j.trial_params for j in again] == lost_params
    assert [j.trial_number for j in again] == [2]


def test_racing_deciders_make_each_trial_once(db: Database, settings: Settings) -> None:
    sweep_id, first = sweep_of(db, settings, trials=6, parallel=3)
    for job in first:
        finish(db, job.id, [0.5], JobStatus.succeeded)
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def decide() -> None:
        try:
            barrier.wait()
            top_up(db, settings, sweep_id)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=decide) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    numbers = sorted(j.trial_number for j in in_db(db, sweep_id))
    assert numbers == [0, 1, 2, 3, 4, 5]
    with db.reader() as s:
        assert s.get(Sweep, sweep_id).trials_created == 6  # type: ignore[union-attr]


def test_the_budget_ends_the_sweep(db: Database, settings: Settings) -> None:
    sweep_id, first = sweep_of(db, settings, trials=3, parallel=2)
    finish(db, first[0].id, [0.4], JobStatus.failed)
    (third,) = top_up(db, settings, sweep_id)
    finish(db, first[1].id, [0.7], JobStatus.succeeded)
    assert top_up(db, settings, sweep_id) == []  # the budget is spent; one is in flight
    with db.reader() as s:
        assert s.get(Sweep, sweep_id).status == SweepStatus.running  # type: ignore[union-attr]
    finish(db, third.id, [0.9], JobStatus.succeeded)
    top_up(db, settings, sweep_id)
    with db.reader() as s:
        sweep = s.get(Sweep, sweep_id)
        assert sweep is not None and sweep.status == SweepStatus.succeeded
        report = trials.report(s, sweep)
    assert report["best"]["job_id"] == third.id and report["best"]["value"] == 0.9
    assert report["budget"] == {
        "trials": 3, "created": 3, "in_flight": 0, "ended": 3, "pruned": 0, "epochs": 3
    }  # fmt: skip


def test_a_sweep_whose_trials_all_fail_fails(db: Database, settings: Settings) -> None:
    sweep_id, first = sweep_of(db, settings, trials=2, parallel=2)
    for job in first:
        finish(db, job.id, [], JobStatus.failed)
    top_up(db, settings, sweep_id)
    with db.reader() as s:
        assert s.get(Sweep, sweep_id).status == SweepStatus.failed  # type: ignore[union-attr]


def test_the_pruner_stops_a_trial_behind_the_others(db: Database, settings: Settings) -> None:
    """ASHA at rung 0 (epoch 1, 1 in 3 go on): three good trials, then a poor one."""
    sweep_id, _ = sweep_of(
        db, settings, trials=8, parallel=1, pruner={"name": "asha", "reduction_factor": 3}
    )
    for accuracy in (0.9, 0.8, 0.85):
        (job,) = [j for j in in_db(db, sweep_id) if j.status == "queued"]
        finish(db, job.id, [accuracy, accuracy + 0.01], JobStatus.succeeded)
        top_up(db, settings, sweep_id)
    (poor,) = [j for j in in_db(db, sweep_id) if j.status == "queued"]
    with db.writer() as s:
        claim_job(s, job_id=poor.id, worker="w", device="cpu")
    judged = judge(db, poor.id, 1, 0.2)
    assert judged is not None
    verdict, why = judged
    assert verdict.prune and "epoch 1" in why and "test_accuracy 0.2" in why
    with db.reader() as s:
        stored = s.scalar(select(Job.trial_attrs).where(Job.id == poor.id))
    assert stored is not None and stored["completed_rung_0"] == 0.2  # kept for the next replay


def test_a_leading_trial_goes_on(db: Database, settings: Settings) -> None:
    _, first = sweep_of(db, settings, trials=4, parallel=2)
    finish(db, first[0].id, [0.5, 0.6], JobStatus.succeeded)
    with db.writer() as s:
        claim_job(s, job_id=first[1].id, worker="w", device="cpu")
    judged = judge(db, first[1].id, 1, 0.95)
    assert judged is not None and not judged[0].prune


def test_cancel_stops_the_sweep(db: Database, settings: Settings) -> None:
    sweep_id, first = sweep_of(db, settings)
    with db.writer() as s:
        claim_job(s, job_id=first[0].id, worker="w", device="cpu")
    with db.writer() as s:
        moved = trials.cancel(s, sweep_id=sweep_id)
    assert moved is not None
    assert sorted(str(o) for _, o in moved) == ["canceled", "running"]
    with db.writer() as s:
        assert trials.cancel(s, sweep_id=sweep_id) is None  # ended already
    with db.writer() as s:
        s.execute(update(Job).where(Job.id == first[0].id).values(status="canceled"))
    assert top_up(db, settings, sweep_id) == []
    with db.reader() as s:
        assert s.get(Sweep, sweep_id).status == SweepStatus.canceled  # type: ignore[union-attr]


@pytest.fixture
def limited(db: Database) -> Iterator[str]:
    owner = "quota-o"
    with db.writer() as s:
        s.add(Quota(owner=owner, limits={"max_queued": 1}))
    yield owner
    with db.writer() as s:
        s.execute(Quota.__table__.delete().where(Quota.owner == owner))


def test_trials_count_against_the_quota(db: Database, settings: Settings, limited: str) -> None:
    spec = SweepSpec.model_validate({"space": SPACE, "trials": 4, "parallel": 3})
    with db.writer() as s:
        sweep, first = trials.create(
            s, settings, spec=spec, owner=limited, quota_owner=limited, idempotency_key=None
        )
        assert len(first) == 1 and sweep.waiting and "max_queued" in sweep.waiting
    # Not even one trial of a second sweep fits.
    with pytest.raises(QuotaExceeded), db.writer() as s:
        trials.create(
            s, settings, spec=spec, owner=limited, quota_owner=limited, idempotency_key=None
        )
    with db.writer() as s:
        claim_job(s, job_id=first[0].id, worker="w", device="cpu")
    (second,) = top_up(db, settings, sweep.id)  # the queued one started: room for one more
    assert second.trial_number == 1


def test_a_key_runs_a_bounded_number_of_sweeps(db: Database) -> None:
    settings = Settings(sweep_max_running_per_key=2)
    spec = SweepSpec.model_validate({"space": SPACE, "trials": 4, "parallel": 1})
    owner = "sweeps-o"

    def create() -> Sweep:
        with db.writer() as s:
            sweep, _ = trials.create(
                s, settings, spec=spec, owner=owner, quota_owner=owner, idempotency_key=None
            )
            return sweep

    first, _second = create(), create()
    with pytest.raises(QuotaExceeded) as e:
        create()
    assert e.value.limit == "sweep_max_running_per_key" and e.value.usage == 2
    with db.writer() as s:
        trials.cancel(s, sweep_id=first.id)
    create()  # a canceled sweep no longer counts
    with db.writer() as s:  # an admin's (no quota owner) are not counted against anyone
        trials.create(s, settings, spec=spec, owner=owner, quota_owner=None, idempotency_key=None)


def test_a_wide_sweep_is_asked_for_a_few_trials_a_transaction(
    db: Database, settings: Settings
) -> None:
    """Each ask replays the sweep while holding SQLite's one write lock: `parallel` 10 is
    made over three top-ups, never more than asked for."""
    sweep_id, first = sweep_of(db, settings, trials=20, parallel=10)
    assert len(first) == trials.ASKS_PER_TRANSACTION
    sizes = [len(top_up(db, settings, sweep_id)) for _ in range(3)]
    assert sizes == [4, 2, 0] and len(in_db(db, sweep_id)) == 10

"""A sweep's trials over the queue: made when the sweep is created and each time one ends
(`top_up`, then `advance` puts them on the queue), judged at each epoch's end
(`judge_epoch`), canceled together (`cancel`), and reported (`report`). See docs/jobs.md."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from redis import Redis
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import Database, EpochMetric, Job, Sweep, as_utc, utcnow
from core.errors import QuotaExceeded
from core.labels import NAME_MAX, Labels
from core.queue import enqueue_or_leave
from core.quotas import JobQuotas, lock_owner
from core.recipes import with_recipe
from core.spec import JobStatus
from core.store import insert_jobs, new_job, request_cancel, spec_hash
from core.store.sweeps import (
    IN_FLIGHT,
    SweepStatus,
    count_running_sweeps,
    end_sweep,
    epochs_of,
    get_sweep,
    lock_sweep,
    trials_of,
)
from core.sweeps.search import Phase, TrialRecord, Verdict, ask, judge
from core.sweeps.spec import SweepSpec

log = logging.getLogger("trainq.sweeps")

PHASES = {
    JobStatus.queued: Phase.running,
    JobStatus.running: Phase.running,
    JobStatus.succeeded: Phase.complete,
    JobStatus.pruned: Phase.pruned,
    JobStatus.failed: Phase.failed,
    JobStatus.canceled: Phase.failed,
}


def sweep_spec(sweep: Sweep) -> SweepSpec:
    return SweepSpec.model_validate(sweep.spec)


def records(
    spec: SweepSpec, trials: Sequence[Job], epochs: dict[str, list[EpochMetric]]
) -> list[TrialRecord]:
    metric = spec.objective.metric.value
    return [
        TrialRecord(
            number=int(job.trial_number or 0),
            state=PHASES[JobStatus(job.status)],
            params=dict(job.trial_params or {}),
            attrs=dict(job.trial_attrs or {}),
            values={e.epoch: float(getattr(e, metric)) for e in epochs.get(job.id, [])},
        )
        for job in trials
    ]


def create(
    s: Session,
    settings: Settings,
    *,
    spec: SweepSpec,
    owner: str | None,
    quota_owner: str | None,
    idempotency_key: str | None,
    labels: Labels | None = None,
) -> tuple[Sweep, list[Job]]:
    """A new sweep and its first trials, in the caller's transaction. Raises QuotaExceeded
    past the key's running sweeps, or when not even one trial may be queued now."""
    labels = labels or Labels()
    if quota_owner is not None:
        _room_for_a_sweep(s, settings, quota_owner)
    sweep = Sweep(
        id=str(uuid.uuid4()),
        owner=owner,
        quota_owner=quota_owner,
        spec=spec.model_dump(mode="json"),
        status=SweepStatus.running,
        idempotency_key=idempotency_key,
        request_hash=spec_hash(spec.model_dump(mode="json")),
        trials_created=0,
        created_at=utcnow(),
        name=labels.name,
        notes=labels.notes,
        tags=list(labels.tags),
    )
    s.add(sweep)
    s.flush()
    first = top_up(s, settings, sweep_id=sweep.id, refuse=True)
    return sweep, first


def _room_for_a_sweep(s: Session, settings: Settings, owner: str) -> None:
    lock_owner(s, owner)  # two creations at once count each other
    running = count_running_sweeps(s, owner=owner)
    limit = settings.sweep_max_running_per_key
    if running >= limit:
        raise QuotaExceeded(
            f"key {owner} has {running} sweeps running, its limit "
            f"(TRAINQ_SWEEP_MAX_RUNNING_PER_KEY): cancel one, or wait for one to end",
            limit="sweep_max_running_per_key",
            value=limit,
            usage=running,
            owner=owner,
            retry_after_s=None,
        )


# Trials asked for in one transaction: each ask replays the whole sweep, a cost that grows
# with its trials, and on SQLite the transaction holds the one write lock every heartbeat
# needs.
ASKS_PER_TRANSACTION = 4


def top_up(s: Session, settings: Settings, *, sweep_id: str, refuse: bool = False) -> list[Job]:
    """Make the trials the sweep is missing now (at most ASKS_PER_TRANSACTION: `advance`
    asks again for the rest), and end it once its budget is spent and no trial is in
    flight. The new jobs are in the session; the caller commits, then puts them on the queue
    (`enqueue`). A quota that refuses a trial leaves it for a later top-up (`refuse`: raise
    if it refuses the first)."""
    sweep = lock_sweep(s, sweep_id=sweep_id)
    if sweep is None or sweep.status != SweepStatus.running:
        return []
    spec = sweep_spec(sweep)
    trials = trials_of(s, sweep_id=sweep_id)
    in_flight = sum(1 for t in trials if t.status in IN_FLIGHT)
    wanted = min(spec.parallel - in_flight, spec.trials - sweep.trials_created)
    if wanted <= 0:
        sweep.waiting = None
        if in_flight == 0 and sweep.trials_created >= spec.trials:
            done = any(t.status == JobStatus.succeeded for t in trials)
            ended = SweepStatus.succeeded if done else SweepStatus.failed
            end_sweep(s, sweep_id=sweep_id, status=ended)
        return []
    known = records(spec, trials, epochs_of(s, sweep_id=sweep_id))
    made = _ask(s, settings, sweep, spec, known, min(wanted, ASKS_PER_TRANSACTION), refuse)
    if made:
        insert_jobs(s, jobs=made)
    s.flush()
    return made


def _ask(
    s: Session,
    settings: Settings,
    sweep: Sweep,
    spec: SweepSpec,
    known: list[TrialRecord],
    n: int,
    refuse: bool,
) -> list[Job]:
    """Up to `n` new trials, each through the owner's quotas; the first refused stops the
    asking (`sweep.waiting` says why)."""
    owner = sweep.quota_owner
    quotas = JobQuotas(s, settings, [owner]) if owner is not None else None
    made: list[Job] = []
    sweep.waiting = None
    for _ in range(n):
        if quotas is not None and owner is not None:
            try:
                quotas.take(owner)
            except QuotaExceeded as e:
                if refuse and not made:
                    raise
                sweep.waiting = e.message
                break
        number = sweep.trials_created
        asked = ask(spec, sweep.id, known, number)
        made.append(_trial_job(sweep, spec, number, asked.params, asked.attrs))
        known.append(TrialRecord(number, Phase.running, asked.params, asked.attrs))
        sweep.trials_created = number + 1
    return made


def _trial_job(
    sweep: Sweep, spec: SweepSpec, number: int, params: dict[str, Any], attrs: dict[str, Any]
) -> Job:
    try:
        trial_spec: Any = spec.trial_spec(params)
    except ValidationError:
        # Outside JobSpec for a reason the space's check could not see (an uploaded set's
        # shape): the job is made as asked and its worker fails it with the reason. Its
        # recipe's knobs are written in, as a valid spec's are: a row without them reads as
        # one stored before they existed (core.spec.stored_spec).
        trial_spec = with_recipe({**spec.base.submitted(), **spec.fixed, **params})
    job = new_job(
        job_id=str(uuid.uuid4()),
        spec=trial_spec,
        owner=sweep.owner,
        idempotency_key=None,
        labels=trial_labels(sweep, number),
    )
    job.sweep_id = sweep.id
    job.trial_number = number
    job.trial_params = params
    job.trial_attrs = attrs
    return job


def trial_labels(sweep: Sweep, number: int) -> Labels:
    """A new trial's: the sweep's tags as they are now, and its name with the trial's number
    (`<name> #<n>`, the name cut to fit); no notes."""
    mark = f" #{number}"
    name = f"{sweep.name[: NAME_MAX - len(mark)].rstrip()}{mark}" if sweep.name else None
    return Labels.model_construct(name=name, tags=tuple(sweep.tags or ()), notes=None)


def enqueue(r: Redis, settings: Settings, jobs: Sequence[Job]) -> None:
    """The committed trials onto the queue; with Redis away, the rest are the reconciler's
    (core.queue.enqueue_or_leave)."""
    for job in jobs:
        if not enqueue_or_leave(r, settings, job, None, what="a trial committed"):
            return


def advance(db: Database, r: Redis, settings: Settings, *, sweep_id: str) -> int:
    """Top the sweep up and queue what it made, a transaction at a time; the number of new
    trials."""
    total = 0
    while True:
        with db.writer() as s:
            made = top_up(s, settings, sweep_id=sweep_id)
        enqueue(r, settings, made)
        total += len(made)
        if made:
            log.info("sweep %s: queued trials %s", sweep_id, [j.trial_number for j in made])
        if len(made) < ASKS_PER_TRANSACTION:
            return total


def judge_epoch(
    s: Session, *, sweep_id: str, number: int, epoch: int, metrics: object
) -> tuple[Verdict, str] | None:
    """At the end of trial `number`'s `epoch` (whose figures are `metrics`, an epoch record
    not stored yet): the pruner's verdict and, if it prunes, the reason; None when the sweep
    has no pruner, or has ended. Read-only, and outside any lock: the replay grows with the
    sweep's trials and runs at every epoch's end. The caller stores the verdict's attributes
    (what the pruner keeps on the trial) with the epoch, and ends the trial if it prunes."""
    sweep = get_sweep(s, sweep_id=sweep_id)
    if sweep is None or sweep.status != SweepStatus.running:
        return None
    spec = sweep_spec(sweep)
    if spec.pruner.name == "none":
        return None
    metric = spec.objective.metric.value
    value = float(getattr(metrics, metric))
    known = records(spec, trials_of(s, sweep_id=sweep.id), epochs_of(s, sweep_id=sweep.id))
    mine = next((t for t in known if t.number == number), None)
    if mine is None:
        return None
    # This epoch's value, and none after it (an earlier attempt's, should one be stored).
    values = {e: v for e, v in mine.values.items() if e < epoch} | {epoch: value}
    now = dataclasses.replace(mine, values=values)
    verdict = judge(spec, sweep.id, [now if t is mine else t for t in known], number)
    why = (
        f"pruned by {spec.pruner.name} at epoch {epoch}: {metric} {value:.4g} is behind the "
        "other trials at this epoch"
    )
    return verdict, why


def cancel(s: Session, *, sweep_id: str) -> list[tuple[Job, JobStatus]] | None:
    """Stop the sweep: no more trials; queued ones end canceled, running ones are asked to
    stop. None if it had ended. Returns each trial moved, with its status after."""
    if not end_sweep(s, sweep_id=sweep_id, status=SweepStatus.canceled):
        return None
    moved = []
    for job in trials_of(s, sweep_id=sweep_id):
        if job.status in IN_FLIGHT:
            outcome = request_cancel(s, job_id=job.id)
            if outcome is not None:
                moved.append((job, outcome))
    return moved


def report(s: Session, sweep: Sweep) -> dict[str, Any]:
    """The sweep as the API shows it: status, budget, best trial, and every trial with its
    values and its objective at each epoch's end."""
    spec = sweep_spec(sweep)
    trials = trials_of(s, sweep_id=sweep.id)
    epochs = epochs_of(s, sweep_id=sweep.id)
    metric, goal = spec.objective.metric.value, spec.objective.goal
    rows = [_trial_row(job, epochs.get(job.id, []), metric) for job in trials]
    done = [r for r in rows if r["status"] == JobStatus.succeeded and r["value"] is not None]
    pick = max if goal == "maximize" else min
    best = pick(done, key=lambda r: r["value"]) if done else None
    in_flight = sum(1 for r in rows if r["status"] in IN_FLIGHT)
    base = f"/sweeps/{sweep.id}"
    return {
        "id": sweep.id,
        "status": sweep.status,
        "name": sweep.name,
        "tags": sweep.tags or [],
        "notes": sweep.notes,
        "spec": sweep.spec,
        "objective": {"metric": metric, "direction": goal.value},
        "created_at": as_utc(sweep.created_at),
        "finished_at": as_utc(sweep.finished_at),
        "waiting": sweep.waiting,
        "budget": {
            "trials": spec.trials,
            "created": sweep.trials_created,
            "in_flight": in_flight,
            "ended": sum(1 for r in rows if r["status"] not in IN_FLIGHT),
            "pruned": sum(1 for r in rows if r["status"] == JobStatus.pruned),
            "epochs": sum(len(r["values"]) for r in rows),
        },
        "best": None
        if best is None
        else {
            "number": best["number"],
            "job_id": best["job_id"],
            "value": best["value"],
            "params": best["params"],
            "links": {"job": best["links"]["job"], "model": f"/jobs/{best['job_id']}/model"},
        },
        "trials": rows,
        "links": {
            "self": base,
            "events": f"{base}/events",
            "cancel": f"{base}/cancel",
            "jobs": f"/jobs?sweep_id={sweep.id}",
        },
    }


def _trial_row(job: Job, epochs: list[EpochMetric], metric: str) -> dict[str, Any]:
    values = [float(getattr(e, metric)) for e in epochs]
    return {
        "number": job.trial_number,
        "job_id": job.id,
        "status": job.status,
        "params": job.trial_params or {},
        "value": values[-1] if values else None,
        "values": values,
        "train_loss": [e.train_loss for e in epochs],
        "test_loss": [e.test_loss for e in epochs],
        "error": {"code": job.error_code, "message": job.error_message or ""}
        if job.error_code
        else None,
        "links": {"job": f"/jobs/{job.id}"},
    }

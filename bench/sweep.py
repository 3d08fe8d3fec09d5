"""Sweeps, measured on real parts (redis-server, SQLite, the API, two `trainq worker`
processes on the CPU, one torch thread each) and on mnist-sample:

1. the search: a sweep of TPE + ASHA against the same budget of trials drawn at random
   and never pruned (same base, space and sampler seed), in the same run: the best test
   accuracy, the epochs trained (the sweep's `budget.epochs`), the wall time (the sweep's
   created_at to finished_at) and the trials pruned, with ratios.
2. the machinery, per trial, apart from training:
   (a) the decider's two calls, timed directly against a database that holds a sweep of 16
       and of 100 ended trials (a SQLite file, and PostgreSQL when reachable): `top_up`
       (the replay of the trials into Optuna, one ask, the insert) and `judge_epoch` (the
       replay and the pruner). The history is grown by the same two calls, on made-up
       accuracies; each timed call is rolled back.
   (b) end to end, each worker's idle time between one job's end and its next job's start:
       between trials (the next one is asked for and queued only once the previous ends)
       against a backlog of plain jobs from POST /jobs (queued before the first ends),
       on the same workers, with the epoch's duration for scale.

Prints one JSON object; progress goes to stderr.

With one seed in both arms, TPE's first trials (drawn at random before it models the space:
a quarter of the budget) are random search's first trials too; `shared_points` counts them.
Each seed of --seeds runs both arms, in alternating order.

    python -m bench.sweep [--quick] [--trials 16] [--epochs 6] [--seeds 0,100,200]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from bench.seed import cpu_description
from core.config import Settings
from core.db import Database, EpochMetric, Job, utcnow
from core.schema import upgrade
from core.spec import JobStatus
from core.store.sweeps import set_trial_attrs, trials_of
from core.sweeps.spec import SweepSpec
from core.sweeps.trials import create, judge_epoch, top_up
from tests.service import Service, postgres_database, scratch_service, wait_until

WORKERS = 2
# One torch thread per worker: two workers on two cores, neither stealing the other's.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SPACE: dict[str, Any] = {
    "lr": {"log_uniform": [1e-4, 3e-2]},
    "batch_size": {"choice": [32, 64, 128, 256]},
    "weight_decay": {"log_uniform": [1e-6, 1e-2]},
}
# The seed's two-block net without augmentation keeps a trial short; no moving average,
# whose 0.999 decay needs more steps than these runs take (16 to 125 an epoch).
BASE: dict[str, Any] = {
    "conv3_channels": 0,
    "augment": "none",
    "ema_decay": None,
    "export": ["torchscript"],
}
ASHA = {"name": "asha", "min_epochs": 1, "reduction_factor": 3}
ARMS = {
    "tpe_asha": {"sampler": "tpe", "pruner": ASHA},
    "random": {"sampler": "random", "pruner": {"name": "none"}},
}
ENDED = ("succeeded", "failed", "canceled", "pruned")


def log(msg: str) -> None:
    print(f"[sweep bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _ts(value: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(value)
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _seconds(start: str, end: str) -> float:
    return (_ts(end) - _ts(start)).total_seconds()


def _median(values: list[float], digits: int = 3) -> float | None:
    return round(statistics.median(values), digits) if values else None


def sweep_body(arm: str, trials: int, epochs: int, seed: int) -> dict[str, Any]:
    return {
        "base": {**BASE, "epochs": epochs},
        "space": SPACE,
        "objective": {"metric": "test_accuracy", "direction": "maximize"},
        "sampler": {"name": ARMS[arm]["sampler"], "seed": seed},
        "pruner": ARMS[arm]["pruner"],
        "trials": trials,
        "parallel": WORKERS,
    }


# --- 1. the search, and 2(b) the gaps between a worker's jobs -------------------------------


def run_arm(svc: Service, arm: str, body: dict[str, Any]) -> dict[str, Any]:
    c, admin = svc.client(), svc.client(svc.admin_key)
    began = time.monotonic()
    sweep = c.create_sweep(body)
    ended = -1
    for seen in c.sweep_events(sweep["id"]):
        budget = seen["budget"]
        if budget["ended"] != ended:
            ended = budget["ended"]
            log(
                f"{arm}: {ended}/{budget['trials']} trials ended, {budget['pruned']} pruned, "
                f"{budget['epochs']} epochs"
            )
    client_s = time.monotonic() - began
    final = c.sweep(sweep["id"])
    jobs = [admin.job(t["job_id"]) for t in final["trials"]]
    epoch_s = [e["duration_s"] for j in jobs for e in c.epochs(j["id"])]
    budget, best = final["budget"], final["best"]
    return {
        "status": final["status"],
        "best_test_accuracy": best["value"] if best else None,
        "best_params": best["params"] if best else None,
        "epochs": budget["epochs"],
        "wall_s": round(_seconds(final["created_at"], final["finished_at"]), 2),
        "wall_s_seen_by_client": round(client_s, 2),
        "trials_pruned": budget["pruned"],
        "trials_succeeded": sum(1 for t in final["trials"] if t["status"] == "succeeded"),
        "trials_failed": sum(1 for t in final["trials"] if t["status"] in ("failed", "canceled")),
        "epochs_by_trial": [len(t["values"]) for t in final["trials"]],
        "params_by_trial": [t["params"] for t in final["trials"]],
        "waiting": final["waiting"],
        "epoch_s_p50": _median(epoch_s),
        "trial_s_p50": _median([_seconds(j["started_at"], j["finished_at"]) for j in jobs]),
        "handoff": handoffs(jobs),
        "device": jobs[0]["device"],
    }


def handoffs(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each worker's idle time between consecutive jobs: the previous one's finished_at to
    the next one's started_at, split at the next one's created_at where it was made after
    the previous ended (a trial: asked for by the worker that ended the previous one)."""
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for j in jobs:
        by_worker[j["worker"]].append(j)
    gaps, decide, queue = [], [], []
    for ran in by_worker.values():
        ran.sort(key=lambda j: _ts(j["started_at"]))
        for prev, nxt in itertools.pairwise(ran):
            gaps.append(_seconds(prev["finished_at"], nxt["started_at"]))
            if _ts(nxt["created_at"]) >= _ts(prev["finished_at"]):
                decide.append(_seconds(prev["finished_at"], nxt["created_at"]))
                queue.append(_seconds(nxt["created_at"], nxt["started_at"]))
    return {
        "pairs": len(gaps),
        "gaps_s": [round(g, 3) for g in gaps],
        "end_to_next_start_s_p50": _median(gaps),
        "end_to_next_start_s_max": round(max(gaps), 3) if gaps else None,
        "end_to_next_created_s_p50": _median(decide),
        "created_to_start_s_p50": _median(queue),
    }


def plain_jobs(svc: Service, jobs: int, epochs: int) -> dict[str, Any]:
    """A backlog of plain jobs (the base spec, as a trial's), submitted at once: every job
    after each worker's first was queued before the worker freed up."""
    c, admin = svc.client(), svc.client(svc.admin_key)
    spec = {**BASE, "epochs": epochs, "batch_size": 128}
    ids = [c.submit(spec)["id"] for _ in range(jobs)]
    wait_until(lambda: all(c.job(i)["status"] in ENDED for i in ids), 1800, "plain jobs", 0.5)
    done = [admin.job(i) for i in ids]
    by_start = sorted(done, key=lambda j: _ts(j["started_at"]))
    idle = [_seconds(j["created_at"], j["started_at"]) for j in by_start[:WORKERS]]
    log(f"plain jobs: {jobs} ended")
    return {
        "jobs": jobs,
        "epochs": epochs,
        "statuses": sorted({j["status"] for j in done}),
        "submit_to_start_idle_worker_s_p50": _median(idle),
        "handoff": handoffs(done),
    }


def search(svc: Service, trials: int, epochs: int, seed: int, flip: bool) -> dict[str, Any]:
    """Both arms with one sampler seed; `flip` runs random search first (order alternates
    between seeds, so that neither arm always runs on the warmer service)."""
    order = list(reversed(ARMS)) if flip else list(ARMS)
    arms = {arm: run_arm(svc, arm, sweep_body(arm, trials, epochs, seed)) for arm in order}
    asha, rnd = arms["tpe_asha"], arms["random"]
    points = [a.pop("params_by_trial") for a in (asha, rnd)]
    shared = sum(1 for a, b in zip(*points, strict=False) if a == b)

    def ratio(key: str) -> float | None:
        return None if not rnd[key] else round(asha[key] / rnd[key], 3)

    both = asha["best_test_accuracy"] is not None and rnd["best_test_accuracy"] is not None
    return {
        "seed": seed,
        "order": order,
        "shared_points": shared,
        **{arm: arms[arm] for arm in ARMS},
        "epochs_ratio": ratio("epochs"),
        "wall_ratio": ratio("wall_s"),
        "accuracy_difference": round(asha["best_test_accuracy"] - rnd["best_test_accuracy"], 4)
        if both
        else None,
    }


def search_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure over the seeds, and its median: TPE + ASHA over (or minus) random."""

    def over_seeds(values: list[Any]) -> dict[str, Any]:
        known = [v for v in values if v is not None]
        return {"per_seed": values, "median": _median(known, 4)}

    out = {
        key: over_seeds([r[key] for r in runs])
        for key in ("epochs_ratio", "wall_ratio", "accuracy_difference")
    }
    for key in ("best_test_accuracy", "epochs", "wall_s", "trials_pruned"):
        out[key] = {arm: over_seeds([r[arm][key] for r in runs]) for arm in ARMS}
    return out


# --- 2(a) the decider's calls against a stored history --------------------------------------


def grown_sweep(db: Database, history: int, epochs: int, settings: Settings) -> str:
    """A running TPE + ASHA sweep whose trials 0..history-1 ended (made-up accuracies, judged
    at each epoch as a worker judges them), trial `history` running after its first epoch, and
    room for one more: the state in which a worker asks for the next trial."""
    spec = SweepSpec.model_validate(
        {**sweep_body("tpe_asha", history + 2, epochs, 0), "parallel": 2}
    )
    with db.writer() as s:
        sweep, _ = create(
            s, settings, spec=spec, owner=None, quota_owner=None, idempotency_key=None
        )
    rng = random.Random(0)
    for number in range(history + 1):
        with db.writer() as s:
            if number < history:  # trial `history` was made as trial history-1 began
                top_up(s, settings, sweep_id=sweep.id)
            job = next(j for j in trials_of(s, sweep_id=sweep.id) if j.trial_number == number)
            job_id, params = job.id, dict(job.trial_params or {})
        _set(db, job_id, status=JobStatus.running, started_at=utcnow())
        last = 1 if number == history else epochs
        for epoch in range(1, last + 1):
            pruned = _epoch_pruned(db, sweep.id, job_id, epoch, _made_up(params, epoch, rng))
            if pruned and number < history:
                _set(db, job_id, status=JobStatus.pruned, finished_at=utcnow())
                break
        else:
            if number < history:
                _set(db, job_id, status=JobStatus.succeeded, finished_at=utcnow())
    return sweep.id


def _made_up(params: dict[str, Any], epoch: int, rng: random.Random) -> float:
    """An accuracy that peaks at lr 3e-3 and rises with the epochs, with a little noise."""
    off = math.log10(params["lr"] / 3e-3)
    ceiling = 0.99 - 0.04 * off * off - 0.01 * math.log10(params["batch_size"] / 32)
    return max(0.1, min(1.0, ceiling * (1 - 0.3 * math.exp(-epoch / 2)) + rng.gauss(0, 0.003)))


def _epoch_pruned(db: Database, sweep_id: str, job_id: str, epoch: int, acc: float) -> bool:
    """As worker.recorder does: judged from a read, then the epoch stored with what the
    pruner keeps on the trial."""
    row = _epoch_row(job_id, epoch, acc)
    with db.reader() as s:
        judged = _judged(s, job_id, epoch, row)
    with db.writer() as s:
        s.add(row)
        if judged is not None:
            set_trial_attrs(s, job_id=job_id, attrs=judged[0].attrs)
    return judged is not None and judged[0].prune


def _judged(s: Session, job_id: str, epoch: int, row: EpochMetric) -> Any:
    job = s.get(Job, job_id)
    if job is None or job.sweep_id is None or job.trial_number is None:
        return None
    return judge_epoch(s, sweep_id=job.sweep_id, number=job.trial_number, epoch=epoch, metrics=row)


def _epoch_row(job_id: str, epoch: int, acc: float) -> EpochMetric:
    return EpochMetric(
        job_id=job_id,
        epoch=epoch,
        step=epoch * 100,
        train_loss=1 - acc,
        train_accuracy=acc,
        test_loss=1 - acc,
        test_accuracy=acc,
        duration_s=1.0,
        images_per_second=1.0,
    )


def _set(db: Database, job_id: str, **values: Any) -> None:
    with db.writer() as s:
        s.execute(update(Job).where(Job.id == job_id).values(**values))


def _timed(db: Database, reps: int, call: Callable[[Session], object]) -> dict[str, float]:
    """`call` in a transaction of its own, flushed and rolled back; milliseconds."""
    times = []
    for _ in range(reps):
        s = db.manual_session()
        try:
            began = time.perf_counter()
            call(s)
            s.flush()
            times.append((time.perf_counter() - began) * 1000)
        finally:
            s.rollback()
            s.close()
    return {"p50": round(statistics.median(times), 2), "max": round(max(times), 2)}


def decider_costs(url: str, history: int, epochs: int, reps: int) -> dict[str, Any]:
    upgrade(url)
    db, settings = Database(url), Settings()
    try:
        began = time.monotonic()
        sweep_id = grown_sweep(db, history, epochs, settings)
        grown_s = time.monotonic() - began
        with db.reader() as s:
            trials = trials_of(s, sweep_id=sweep_id)
            running = next(j for j in trials if j.status == JobStatus.running)
            pruned = sum(1 for j in trials if j.status == JobStatus.pruned)

        def ask(s: Session) -> None:
            if len(top_up(s, settings, sweep_id=sweep_id)) != 1:
                raise RuntimeError("top_up made no trial: the history is not as intended")

        def judge(s: Session) -> None:
            if _judged(s, running.id, 1, _epoch_row(running.id, 1, 0.5)) is None:
                raise RuntimeError("judge_epoch judged nothing: the history is not as intended")

        return {
            "ended_trials": history,
            "pruned_in_history": pruned,
            "history_built_s": round(grown_s, 1),
            "top_up_ms": _timed(db, reps, ask),
            "judge_epoch_ms": _timed(db, reps, judge),
        }
    finally:
        db.dispose()


@contextmanager
def postgres() -> Iterator[str | None]:
    """A scratch PostgreSQL database, or None where none is reachable."""
    databases = contextmanager(postgres_database)
    try:
        with databases() as url:
            yield url
    except pytest.skip.Exception as e:
        log(f"PostgreSQL skipped: {e}")
        yield None


def machinery(histories: list[int], epochs: int, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"reps": reps}
    with tempfile.TemporaryDirectory(prefix="trainq-bench-") as tmp:
        for n in histories:
            out[f"sqlite_{n}_trials"] = decider_costs(
                f"sqlite:///{Path(tmp) / f'{n}.db'}", n, epochs, reps
            )
            log(f"decider on SQLite, {n} trials: {out[f'sqlite_{n}_trials']}")
    for n in histories:
        with postgres() as url:
            if url is None:
                out[f"postgres_{n}_trials"] = "not reachable"
                continue
            out[f"postgres_{n}_trials"] = decider_costs(url, n, epochs, reps)
            log(f"decider on PostgreSQL, {n} trials: {out[f'postgres_{n}_trials']}")
    return out


# --- the run ----------------------------------------------------------------------------------


def overhead_summary(runs: list[dict[str, Any]], plain: dict[str, Any]) -> dict[str, Any]:
    """Each worker's idle time between trials (all seeds pooled) against the plain backlog's,
    and against an epoch."""
    base = plain["handoff"]["end_to_next_start_s_p50"]
    out: dict[str, Any] = {"plain_job_end_to_next_start_s_p50": base}
    for arm in ARMS:
        gaps = [g for r in runs for g in r[arm]["handoff"]["gaps_s"]]
        gap = _median(gaps)
        epoch = _median([r[arm]["epoch_s_p50"] for r in runs if r[arm]["epoch_s_p50"]])
        out[arm] = {
            "pairs": len(gaps),
            "trial_end_to_next_start_s_p50": gap,
            "trial_end_to_next_created_s_p50": _median(
                [r[arm]["handoff"]["end_to_next_created_s_p50"] for r in runs]
            ),
            "extra_over_plain_s": None if gap is None or base is None else round(gap - base, 3),
            "epoch_s_p50": epoch,
            "gap_over_epoch": None if gap is None or not epoch else round(gap / epoch, 4),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick", action="store_true", help="4 trials of 2 epochs, one seed: a smoke run"
    )
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument(
        "--seeds",
        default=None,
        help="sampler seeds, comma-separated: both arms with each "
        "(default 0,100,200; 0 with --quick)",
    )
    p.add_argument("--plain-jobs", type=int, default=8)
    p.add_argument("--reps", type=int, default=20, help="timed calls of each decider call")
    args = p.parse_args()
    histories = [16, 100]
    if args.quick:
        args.trials, args.epochs, args.plain_jobs, args.reps, histories = 4, 2, 4, 3, [16]
        args.seeds = args.seeds or "0"
    load_before = os.getloadavg()
    began = time.monotonic()
    with scratch_service(workers=WORKERS, env=WORKER_ENV) as svc:
        log(f"service up, {WORKERS} workers; a backlog of {args.plain_jobs} plain jobs first")
        plain = plain_jobs(svc, args.plain_jobs, 1)
        seeds = [int(x) for x in (args.seeds or "0,100,200").split(",")]
        runs = [search(svc, args.trials, args.epochs, sd, i % 2 == 1) for i, sd in enumerate(seeds)]
    log("service down; the decider's calls, timed alone")
    decider = machinery(histories, args.epochs, args.reps)
    out = {
        "benchmark": "sweep",
        "cpu": cpu_description(),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "workers": WORKERS,
        "worker_env": WORKER_ENV,
        "dataset": "mnist-sample",
        "trials": args.trials,
        "epochs": args.epochs,
        "space": SPACE,
        "base": BASE,
        "search": search_summary(runs),
        "runs": runs,
        "plain_jobs": plain,
        "overhead": overhead_summary(runs, plain),
        "decider": decider,
        "bench_s": round(time.monotonic() - began, 1),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

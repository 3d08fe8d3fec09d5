"""GET /jobs at 100,000 jobs: filtered and ordered first pages and a deep cursor page, through
real HTTP (the API under uvicorn, a redis-server), on a fresh SQLite file and on the
PostgreSQL at TRAINQ_TEST_POSTGRES_URL (a database of its own, dropped afterwards).

The jobs are inserted straight into the database (no worker trains them): 100,000 rows over
seven owners, the caller's 40,000 of them; statuses, data sets, architectures, tags, names,
sweeps and final figures spread as a busy team's would be, times with ties. Each case is
timed over --rounds requests after a warm-up; the baseline, in the same run, is the listing
as it was before the search (newest first, no filter), and each case's query plan is
checked to use an index (no full scan of jobs, no sort of the whole owner's jobs).

Prints one JSON object.    python -m bench.job_search [--jobs 100000] [--rounds 200]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import Engine

from core.db import Job, JobTag
from core.labels import name_key
from core.owners import owner_id
from core.schema import upgrade
from core.spec import SPEC_VERSION, Architecture, JobSpec, JobStatus
from tests.service import POSTGRES_URL, RedisServer, Service

KEY = "key-bench-caller"
OTHERS = tuple(f"key-bench-other{i}" for i in range(6))
CALLER_SHARE = 0.4
STATUSES = [("succeeded", 60), ("failed", 15), ("canceled", 10), ("pruned", 10),
            ("queued", 3), ("running", 2)]  # fmt: skip
DATASETS = [("mnist-sample", 40), ("mnist", 30), ("fashion-mnist", 25), ("ds:", 5)]
MODELS = [("cnn", 60), ("resnet18", 20), ("mobilenet_v3_small", 10), ("efficientnet_b0", 10)]
UPLOADED = [str(uuid.UUID(int=i + 1)) for i in range(5)]
SWEEPS = 400
DAYS = 90
OPTIONAL = (
    "name", "name_key", "sweep_id", "trial_number", "started_at", "finished_at", "result",
    "final_test_accuracy", "final_test_loss", "final_train_loss", "final_images_per_second",
    "final_duration_s", "final_train_accuracy",
)  # fmt: skip


def _pick(rng: random.Random, weighted: list[tuple[str, int]]) -> str:
    return rng.choices([v for v, _ in weighted], [w for _, w in weighted])[0]


def _tags(rng: random.Random) -> list[str]:
    """baseline 20%, team:vision 30%, one of 200 experiments (0.5% each) 60%, rare 0.1%."""
    tags = []
    if rng.random() < 0.2:
        tags.append("baseline")
    if rng.random() < 0.3:
        tags.append("team:vision")
    if rng.random() < 0.6:
        tags.append(f"exp-{rng.randrange(200)}")
    if rng.random() < 0.001:
        tags.append("rare")
    return tags


def rows(n: int, seed: int = 0) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """The jobs, oldest first: each row and its tag rows."""
    rng = random.Random(seed)
    owners = [owner_id(KEY)] + [owner_id(k) for k in OTHERS]
    share = [CALLER_SHARE] + [(1 - CALLER_SHARE) / len(OTHERS)] * len(OTHERS)
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=DAYS)
    step = dt.timedelta(days=DAYS) / n
    specs: dict[tuple[str, str], dict[str, Any]] = {}
    for i in range(n):
        owner = rng.choices(owners, share)[0]
        dataset = _pick(rng, DATASETS)
        if dataset == "ds:":
            dataset += rng.choice(UPLOADED)
        model = _pick(rng, MODELS)
        spec = specs.get((dataset, model))
        if spec is None:
            spec = specs[dataset, model] = JobSpec(dataset=dataset, model=model).model_dump(
                mode="json"
            )
        status = _pick(rng, STATUSES)
        created = start + step * (i - i % 2)  # pairs created at one instant: ties
        row: dict[str, Any] = {
            "id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "owner": owner,
            "status": status,
            "spec": spec,
            "request_hash": "0" * 64,
            "created_at": created,
            "enqueued_at": created,
            "attempt": 0 if status == "queued" else 1,
            "preemptions": 0,
            "progress_step": 0,
            "progress_epoch": 0,
            "cancel_requested": False,
            "priority": 0,
            "spec_version": SPEC_VERSION,
            "dataset": dataset,
            "model": model,
            "tags": _tags(rng),
            **dict.fromkeys(OPTIONAL),
        }
        if rng.random() < 0.7:
            prefix = rng.choice(["pretrain", "finetune", "baseline", "ablation", "Sweep"])
            row["name"] = f"{prefix}-{model}-{dataset[:12]}-{i}"
            row["name_key"] = name_key(row["name"])
        if rng.random() < 0.2:
            row["sweep_id"] = str(uuid.UUID(int=rng.randrange(SWEEPS) + 1))
            row["trial_number"] = i
        if status != "queued":
            row["started_at"] = created + dt.timedelta(seconds=5)
        if status not in ("queued", "running"):
            row["finished_at"] = created + dt.timedelta(seconds=rng.randrange(30, 3600))
        if status == "succeeded":
            figures = {
                "test_accuracy": round(rng.uniform(0.8, 0.995), 4),  # 4 digits: ties
                "test_loss": round(rng.uniform(0.02, 0.6), 5),
                "train_loss": round(rng.uniform(0.02, 0.6), 5),
                "images_per_second": round(rng.uniform(2_000, 90_000), 1),
                "duration_s": round(rng.uniform(20, 3600), 2),
            }
            row["result"] = {**figures, "epochs": 8, "steps": 640, "stopped_early": None}
            row.update({f"final_{k}": v for k, v in figures.items()})
            row["final_train_accuracy"] = round(rng.uniform(0.8, 0.999), 4)
        tags = [
            {"job_id": row["id"], "tag": t, "owner": owner, "created_at": created}
            for t in row["tags"]
        ]
        yield row, tags


def seed(engine: Engine, n: int) -> None:
    """n jobs inserted straight into the migrated database, 5,000 a transaction."""
    batch: list[dict[str, Any]] = []
    tags: list[dict[str, Any]] = []

    def flush() -> None:
        with engine.begin() as conn:
            conn.execute(insert(Job), batch)
            if tags:
                conn.execute(insert(JobTag), tags)
        batch.clear()
        tags.clear()

    for row, tag_rows in rows(n):
        batch.append(row)
        tags.extend(tag_rows)
        if len(batch) == 5000:
            flush()
    if batch:
        flush()
    if engine.dialect.name == "postgresql":
        # What autovacuum does after a load this size; trainq never runs ANALYZE on SQLite,
        # so its plans there are made without statistics, as in a deployment.
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))


NOW = dt.datetime.now(dt.UTC)
WEEK_AGO = (NOW - dt.timedelta(days=7)).isoformat()
DAY_AGO = (NOW - dt.timedelta(days=1)).isoformat()
SWEEP = str(uuid.UUID(int=8))
# Each case: GET /jobs's query (limit 50 unless given). The baseline is the listing as it
# was before the search: the caller's jobs, newest first, no filter.
CASES: dict[str, dict[str, Any]] = {
    "baseline_newest_first": {},
    "status_succeeded": {"status": "succeeded"},
    "status_failed_or_canceled": {"status": ["failed", "canceled"]},
    "tag_common_30pct": {"tag": "team:vision"},
    "tag_one_experiment_0.5pct": {"tag": "exp-7"},
    "tag_rare_0.1pct": {"tag": "rare"},
    "two_tags": {"tag": ["baseline", "team:vision"]},
    "tag_and_status": {"tag": "baseline", "status": "succeeded"},
    "name_prefix_common": {"name": "pretrain"},
    "name_prefix_narrow": {"name": "pretrain-resnet18-mnist-sample-9"},
    "uploaded_dataset_1pct": {"dataset": f"ds:{UPLOADED[2]}"},
    "model": {"model": "resnet18"},
    "sweep_trials": {"sweep_id": SWEEP},
    "last_7_days": {"created_after": WEEK_AGO},
    "best_test_accuracy": {"sort": "-test_accuracy"},
    "lowest_test_loss_cnn": {"sort": "test_loss", "model": "cnn"},
    "longest_duration": {"sort": "-duration"},
    "best_accuracy_one_experiment": {"sort": "-test_accuracy", "tag": "exp-7"},
    "best_accuracy_common_tag": {"sort": "-test_accuracy", "tag": "team:vision"},
    "best_accuracy_rare_tag": {"sort": "-test_accuracy", "tag": "rare"},
    "best_accuracy_last_7_days": {"sort": "-test_accuracy", "created_after": WEEK_AGO},
    "best_accuracy_last_day": {"sort": "-test_accuracy", "created_after": DAY_AGO},
    "best_accuracy_of_a_sweep": {"sort": "-test_accuracy", "sweep_id": SWEEP},
}
# Deep pages: the page after a fifth of all the jobs (20,000 of 100,000; the caller's
# succeeded ones are a quarter), its cursor found by walking there first.
DEEP_SHARE = 0.2
DEEP = {"deep_page_newest_first": {}, "deep_page_best_accuracy": {"sort": "-test_accuracy"}}


def timed(http: httpx.Client, params: dict[str, Any], rounds: int) -> dict[str, Any]:
    """p50/p99 of `rounds` requests, one at a time, after a warm-up."""
    query = {"limit": 50, **params}
    for _ in range(5):
        first = http.get("/jobs", params=query)
        first.raise_for_status()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        r = http.get("/jobs", params=query)
        times.append(time.perf_counter() - t0)
        r.raise_for_status()
    times.sort()
    return {
        "p50_ms": round(1000 * statistics.median(times), 2),
        "p99_ms": round(1000 * times[min(len(times) - 1, int(len(times) * 0.99))], 2),
        "rows": len(first.json()["items"]),
    }


def deep_cursor(http: httpx.Client, params: dict[str, Any], depth: int) -> str:
    query: dict[str, Any] = {"limit": 200, **params}
    for _ in range(depth // 200):
        page = http.get("/jobs", params=query).json()
        query["cursor"] = page["next"]
    return str(query["cursor"])


def plans(url: str, params: dict[str, Any]) -> list[str]:
    """The query plans of the statements a page runs (the search's, in this process)."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    from api.job_queries import job_query
    from core.store.search import Scope, search_jobs

    typed = {
        "status": lambda v: [JobStatus(x) for x in ([v] if isinstance(v, str) else v)],
        "tag": lambda v: [v] if isinstance(v, str) else v,
        "model": Architecture,
        "sweep_id": uuid.UUID,
        "created_after": dt.datetime.fromisoformat,
    }
    given = {k: typed.get(k, lambda v: v)(v) for k, v in params.items()}
    query = job_query(**given)
    engine = create_engine(url)
    seen: list[tuple[str, Any]] = []
    event.listen(
        engine, "before_cursor_execute", lambda c, cur, st, p, ctx, m: seen.append((st, p))
    )
    explain = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
    out: list[str] = []
    try:
        with Session(engine) as s:
            search_jobs(s, scope=Scope(owner_id(KEY), everyone=False), filters=query.filters,
                        sort=query.sort, after=query.after, limit=51)  # fmt: skip
            statements = list(seen)
            for statement, bound in statements:
                rows = s.connection().exec_driver_sql(explain + statement, bound).all()
                out.append(" | ".join(str(row[-1]).strip() for row in rows))
    finally:
        engine.dispose()
    return out


# A page's query that reads a whole table. (The counts before it, one a filter, stop at
# core.store.search.CANDIDATES_MAX + 1 rows, whichever way they read: PostgreSQL reads a
# common tag's first thousand rows from the table itself, which is cheaper.)
FULL_SCANS = ("SCAN jobs", "Seq Scan on jobs", "Seq Scan on job_tags", "SCAN job_tags")


def measure(url: str, n: int, rounds: int, folder: Path) -> dict[str, Any]:
    started = time.perf_counter()
    upgrade(url)
    engine = create_engine(url)
    try:
        seed(engine, n)
    finally:
        engine.dispose()
    seeded_s = time.perf_counter() - started
    redis = RedisServer(folder / "redis", appendfsync="everysec")
    redis.start()
    svc = Service(
        data_dir=folder, database_url=url, redis=redis, keys=(KEY, OTHERS[0]),
        tenant_keys=OTHERS[1:], log_dir=folder,
    )  # fmt: skip
    cases: dict[str, Any] = {}
    try:
        svc.up(workers=0)
        with httpx.Client(
            base_url=svc.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
        ) as http:
            for name, params in CASES.items():
                cases[name] = {**timed(http, params, rounds), "plans": plans(url, params)}
            for name, params in DEEP.items():
                cursor = deep_cursor(http, params, int(n * DEEP_SHARE))
                cases[name] = timed(http, {**params, "cursor": cursor}, rounds)
    finally:
        svc.stop()
        redis.kill()
    scans = [
        k
        for k, v in cases.items()
        if v.get("plans") and any(s in v["plans"][-1] for s in FULL_SCANS)
    ]
    return {"seed_s": round(seeded_s, 1), "cases_with_a_full_scan": scans, "cases": cases}


@contextlib.contextmanager
def postgres_database() -> Iterator[str | None]:
    """A database of its own on the server at TRAINQ_TEST_POSTGRES_URL, dropped afterwards;
    None where no server answers."""
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    name = f"trainq_bench_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception:
        admin.dispose()
        yield None
        return
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--only", choices=("sqlite", "postgres"))
    args = p.parse_args()
    out: dict[str, Any] = {
        "jobs": args.jobs,
        "caller_jobs_share": CALLER_SHARE,
        "rounds": args.rounds,
        "limit": 50,
        "deep_page_after_jobs": int(args.jobs * DEEP_SHARE),
    }
    with tempfile.TemporaryDirectory(prefix="trainq-bench-") as tmp:
        root = Path(tmp)
        if args.only != "postgres":
            (root / "sqlite").mkdir()
            url = f"sqlite:///{root / 'sqlite' / 'trainq.db'}"
            out["sqlite"] = measure(url, args.jobs, args.rounds, root / "sqlite")
        if args.only != "sqlite":
            with postgres_database() as pg:
                if pg is None:
                    out["postgres"] = f"no PostgreSQL answers at {POSTGRES_URL}"
                else:
                    (root / "postgres").mkdir()
                    out["postgres"] = measure(pg, args.jobs, args.rounds, root / "postgres")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""A queued job whose queue entry is gone, or spoiled past reading, is enqueued again by
the reconciler's pass, and junk in one entry stops neither the pass nor the launcher that
runs it; an entry a live worker holds is left alone."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import update

from core.config import Settings
from core.db import Database, Job, utcnow
from core.queue import enqueue_job
from core.spec import USER_DATASETS, JobSpec
from core.store import create_job, get_job
from tests.service import RedisServer
from worker.reconciler import Reconciler, reconcile_once

QUEUE = f"trainq-test-{uuid.uuid4().hex[:8]}"  # enqueued jobs go here, to no worker


def queued_a_while(db: Database, queue_entry: str | None, job_id: str | None = None) -> str:
    """A queued job (a new id, unless given), enqueued two minutes ago under `queue_entry`."""
    job_id = job_id or str(uuid.uuid4())
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec(), owner="o")
    with db.writer() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(queue_entry=queue_entry, enqueued_at=utcnow() - dt.timedelta(seconds=120))
        )
    return job_id


def junk_entries(r: Any) -> list[str]:
    """Entries a Redis writer spoiled that nothing can read as live: a started one naming a
    worker whose heartbeat is junk, one whose status is a megabyte, one whose key is no
    hash."""
    started, huge, string, worker = (f"e-{uuid.uuid4().hex}" for _ in range(4))
    r.hset(f"rq:job:{started}", mapping={"status": "started", "worker_name": worker})
    r.hset(f"rq:worker:{worker}", mapping={"last_heartbeat": "junk"})
    r.hset(f"rq:job:{huge}", mapping={"status": "x" * 2**20})
    r.set(f"rq:job:{string}", "junk")
    return [started, huge, string]


def test_an_entry_nothing_can_read_as_live_is_enqueued_again(
    db: Database, redis_server: RedisServer
) -> None:
    """And the pass that meets it still reconciles every other job."""
    with redis_server.client() as r:
        dead = [queued_a_while(db, entry) for entry in junk_entries(r)]
        plain = queued_a_while(db, None)
        report = reconcile_once(db, r, Settings(queue_grace_s=30, queue=QUEUE))
    assert {*dead, plain} <= set(report.reenqueued)


def test_a_waiting_entry_rq_cannot_restore_stops_no_pass(
    db: Database, redis_server: RedisServer
) -> None:
    """A junk date in a waiting entry: the entry is still waiting (the worker that dequeues
    it drops it, and the next pass enqueues its job again), and the other jobs are
    reconciled."""
    job_id = str(uuid.uuid4())
    with redis_server.client() as r:
        enqueue_job(r, queue=QUEUE, job_id=job_id, spec={}, owner="o", timeout_s=60)
        r.hset(f"rq:job:{job_id}", "created_at", "junk")
        queued_a_while(db, job_id, job_id=job_id)
        plain = queued_a_while(db, None)
        report = reconcile_once(db, r, Settings(queue_grace_s=30, queue=QUEUE))
    assert plain in report.reenqueued and job_id not in report.reenqueued


def test_a_live_worker_s_entry_is_left_alone(db: Database, redis_server: RedisServer) -> None:
    """The bounded reads still see a worker that beats (by Redis's clock)."""
    entry, worker = str(uuid.uuid4()), f"w-{uuid.uuid4().hex}"
    with redis_server.client() as r:
        seconds, micros = r.time()
        beat = dt.datetime.fromtimestamp(seconds + micros / 1e6, dt.UTC)
        enqueue_job(r, queue=QUEUE, job_id=entry, spec={}, owner="o", timeout_s=60)
        r.hset(f"rq:job:{entry}", mapping={"status": "started", "worker_name": worker})
        r.hset(f"rq:worker:{worker}", "last_heartbeat", beat.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        job_id = queued_a_while(db, entry)
        report = reconcile_once(db, r, Settings(queue_grace_s=30, queue=QUEUE))
    assert job_id not in report.reenqueued


def test_the_launchers_reconciler_survives_a_pass_that_meets_junk(
    db: Database, database_url: str, redis_server: RedisServer
) -> None:
    """The pass `trainq worker` and `trainq serve` run: junk in an entry ends neither it nor
    the launcher, and the other stale jobs are enqueued again."""
    job_id = str(uuid.uuid4())
    with redis_server.client() as r:
        enqueue_job(r, queue=QUEUE, job_id=job_id, spec={}, owner="o", timeout_s=60)
        r.hset(f"rq:job:{job_id}", mapping={"status": "started", "worker_name": "w"})
        r.hset("rq:worker:w", mapping={"last_heartbeat": "junk"})
    poisoned = queued_a_while(db, job_id)
    plain = queued_a_while(db, None)
    settings = Settings(database_url=database_url, queue=QUEUE, queue_grace_s=30)
    reconcile = Reconciler(settings, redis_server.url)
    reconcile()
    assert reconcile.db is not None
    reconcile.db.dispose()
    with db.writer() as s:
        entries = [get_job(s, job_id=j).queue_entry for j in (poisoned, plain)]  # type: ignore[union-attr]
    assert all(entries) and job_id not in entries


def test_with_redis_away_the_pass_still_prunes_what_needs_no_redis(
    db: Database, database_url: str, tmp_path: Path
) -> None:
    """Redis unreachable: the queue's half of the pass is skipped, but the database's and the
    disk's are not (retention, and the copies of deleted data sets, which would otherwise
    fill a host's disk for as long as Redis is away)."""
    folder = tmp_path.joinpath(*USER_DATASETS)
    folder.mkdir(parents=True)
    gone = folder / f"{uuid.uuid4()}.npz"  # a copy of a set that no longer exists
    gone.write_bytes(b"npz")
    queued_a_while(db, None)  # a job whose entry the pass would restore, in Redis
    settings = Settings(database_url=database_url, queue=QUEUE, data_dir=tmp_path)
    reconcile = Reconciler(settings, "redis://127.0.0.1:9/0")  # nothing listens there
    reconcile()
    assert reconcile.db is not None
    reconcile.db.dispose()
    assert not gone.exists()

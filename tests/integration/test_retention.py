"""Retention and deletion over real processes (the API, a CPU worker, a redis-server; SQLite
and PostgreSQL): an ended job's checkpoint goes with its end, DELETE of a job and of a data
set, the retention pass from the reconciler, `trainq gc`, the stored-bytes gauges, and a
200 MB model streamed with flat memory."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from redis import Redis
from sqlalchemy import func, insert, select, text

from client.http import ApiError
from core.db import (
    Artifact,
    Checkpoint,
    Database,
    EpochMetric,
    Job,
    StepMetric,
    UserDataset,
    utcnow,
)
from core.queue import job_queue
from core.retention import STEP_ROW_BYTES, purge_batch
from core.spec import JobSpec, JobStatus
from core.store import claim_job, new_job, request_cancel, requeue_job
from tests.db import migrated
from tests.memory import peak_growth_mib
from tests.service import REPO, RedisServer, Service, trained, wait_until

# A small net, so that an epoch of mnist-sample takes moments on a busy CPU.
TINY = {
    "conv1_channels": 4,
    "conv2_channels": 4,
    "conv3_channels": 0,
    "hidden": 8,
    "augment": "none",
    "ema_decay": None,
    "batch_size": 256,
    "export": ["torchscript"],
}
LONG = {**TINY, "epochs": 200}  # runs until canceled
SHORT = {**TINY, "epochs": 1, "max_steps": 3}
RETENTION_DAYS = 30  # the service's own policy: jobs older than this go by themselves


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def svc(service_data_dir: Path, database_url: str, redis_server: RedisServer) -> Iterator[Service]:
    service = Service(
        data_dir=service_data_dir,
        database_url=database_url,
        redis=redis_server,
        extra_env={
            "TRAINQ_RECONCILE_INTERVAL_S": "0.5",
            "TRAINQ_RETENTION_DAYS": str(RETENTION_DAYS),
            "TRAINQ_RETENTION_BATCH": "7",
        },
    )
    yield service.up(workers=1)
    service.stop()


@pytest.fixture(scope="module")
def sdb(svc: Service) -> Iterator[Database]:
    database = Database(svc.database_url)
    yield database
    database.dispose()


def rows_of(db: Database, job_id: str) -> dict[str, int]:
    """How many rows each table holds of the job."""
    with db.reader() as s:
        return {
            t.__tablename__: s.scalar(select(func.count()).select_from(t).where(c == job_id)) or 0
            for t, c in (
                (Job, Job.id),
                (Artifact, Artifact.job_id),
                (Checkpoint, Checkpoint.job_id),
                (StepMetric, StepMetric.job_id),
                (EpochMetric, EpochMetric.job_id),
            )
        }


def redis_traces(r: Redis, job_id: str) -> list[str]:
    """Every key naming the job, and every list or sorted set (RQ's queue and registries)
    holding one of its entries."""
    found = [k.decode() for k in r.scan_iter(match=f"*{job_id}*")]
    for key in r.scan_iter():
        kind = r.type(key)
        if kind == b"zset":
            members = r.zrange(key, 0, -1)
        elif kind == b"list":
            members = r.lrange(key, 0, -1)
        else:
            continue
        found += [f"{key.decode()}:{m.decode()}" for m in members if job_id in m.decode()]
    return found


def rq_done(svc: Service, entry: str) -> None:
    """Wait until RQ's worker has finished its own records of the entry (its status, its
    execution, its place among those started): it writes them after the job's end is in
    the database."""
    r = svc.redis.client()
    started = job_queue(r, svc.queue).started_job_registry.key

    def done() -> bool:
        return (
            r.hget(f"rq:job:{entry}", "status") in (b"finished", b"failed")
            and not list(r.scan_iter(match=f"rq:execution:{entry}:*"))
            and not any(entry in m.decode() for m in r.zrange(started, 0, -1))
        )

    wait_until(done, 30, "RQ to finish the entry", 0.1)


def wait_status(c: Any, job_id: str, *statuses: str) -> dict[str, Any]:
    return wait_until(
        lambda: (j := c.job(job_id))["status"] in statuses and j, 180, f"job {statuses}", 0.1
    )


# -- checkpoints ------------------------------------------------------------------------


def test_checkpoint_goes_with_the_end_of_a_job(svc: Service, sdb: Database) -> None:
    c = svc.client()
    done = trained(c, SHORT)
    assert rows_of(sdb, done["id"])["checkpoints"] == 0
    job = c.submit(LONG)
    wait_until(lambda: rows_of(sdb, job["id"])["checkpoints"] == 1, 180, "a first checkpoint")
    c.cancel(job["id"])
    wait_status(c, job["id"], "canceled")
    assert rows_of(sdb, job["id"])["checkpoints"] == 0


def test_a_requeued_job_keeps_its_checkpoint_until_it_ends(sdb: Database) -> None:
    """The reconciler's requeue (a lost worker) resumes from the checkpoint: it stays while
    the job is queued again, and goes when the queued job is canceled."""
    job_id = str(uuid.uuid4())
    with sdb.writer() as s:
        s.add(new_job(job_id=job_id, spec=JobSpec(**SHORT), owner="o", idempotency_key=None))
    with sdb.writer() as s:
        assert claim_job(s, job_id=job_id, worker="w", device="cpu") is not None
        s.add(Checkpoint(job_id=job_id, epoch=1, step=3, data=b"weights"))
    with sdb.writer() as s:
        assert requeue_job(
            s, job_id=job_id, attempt=1, queue_entry=f"{job_id}-a2", silent_since=utcnow()
        )
    assert rows_of(sdb, job_id)["checkpoints"] == 1
    with sdb.writer() as s:
        assert request_cancel(s, job_id=job_id) is JobStatus.canceled
    assert rows_of(sdb, job_id)["checkpoints"] == 0


# -- DELETE /jobs/{id} ------------------------------------------------------------------


def test_delete_job_refused_while_running_then_removes_everything(
    svc: Service, sdb: Database
) -> None:
    c = svc.client()
    r = svc.redis.client()
    job = c.submit(LONG)
    wait_until(lambda: rows_of(sdb, job["id"])["step_metrics"] > 0, 180, "an epoch stored")
    resp = httpx.delete(f"{svc.url}/jobs/{job['id']}", headers=auth(svc.keys[0]))
    assert resp.status_code == 409 and "cancel" in resp.json()["detail"], resp.text
    other = httpx.delete(f"{svc.url}/jobs/{job['id']}", headers=auth(svc.keys[1]))
    assert other.status_code == 404, other.text  # another owner's: as if missing
    c.cancel(job["id"])
    wait_status(c, job["id"], "canceled")
    rq_done(svc, job["id"])
    assert rows_of(sdb, job["id"])["epoch_metrics"] > 0 and redis_traces(r, job["id"])

    c.delete(job["id"])
    assert set(rows_of(sdb, job["id"]).values()) == {0}
    assert redis_traces(r, job["id"]) == []
    for path in ("", "/metrics", "/epochs", "/model", "/record", "/events"):
        assert (
            httpx.get(f"{svc.url}/jobs/{job['id']}{path}", headers=auth(svc.keys[0])).status_code
            == 404
        )
    with pytest.raises(ApiError) as again:
        c.delete(job["id"])
    assert again.value.status == 404


def test_delete_succeeded_job_removes_its_model(svc: Service, sdb: Database) -> None:
    c = svc.client()
    done = trained(c, SHORT)
    before = rows_of(sdb, done["id"])
    assert before["artifacts"] == 2 and before["step_metrics"] == 3  # the model and its weights
    rq_done(svc, done["id"])
    httpx.delete(f"{svc.url}/jobs/{done['id']}", headers=auth(svc.admin_key)).raise_for_status()
    assert set(rows_of(sdb, done["id"]).values()) == {0}
    assert redis_traces(svc.redis.client(), done["id"]) == []


def test_delete_queued_job_is_409_and_a_canceled_one_leaves_no_entry(svc: Service) -> None:
    """A job canceled while queued leaves its entry on the queue; deleting the job takes
    the entry too, so no worker ever admits it as a new job."""
    svc.stop_workers()
    try:
        c = svc.client()
        job = c.submit(SHORT)
        with pytest.raises(ApiError) as refused:
            c.delete(job["id"])
        assert refused.value.status == 409
        c.cancel(job["id"])
        r = svc.redis.client()
        assert redis_traces(r, job["id"])  # the entry waits on the queue
        c.delete(job["id"])
        assert redis_traces(r, job["id"]) == []
    finally:
        svc.start_worker()
        svc.wait_for_workers(1)


# -- DELETE /datasets/{id} --------------------------------------------------------------


def small_set() -> bytes:
    import io

    g = np.random.default_rng(0)
    buf = io.BytesIO()
    np.savez(
        buf,
        x_train=g.integers(0, 256, (64, 28, 28), dtype=np.uint8),
        y_train=np.arange(64) % 4,
        x_test=g.integers(0, 256, (16, 28, 28), dtype=np.uint8),
        y_test=np.arange(16) % 4,
    )
    return buf.getvalue()


def upload(svc: Service) -> str:
    r = httpx.post(
        f"{svc.url}/datasets",
        headers=auth(svc.keys[0]),
        files={"file": ("s.npz", small_set(), "application/octet-stream")},
        data={"name": "s"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_delete_dataset_refused_while_a_job_uses_it(svc: Service) -> None:
    c = svc.client()
    ds = upload(svc)
    job = c.submit({**LONG, "dataset": f"ds:{ds}"})
    url = f"{svc.url}/datasets/{ds}"
    resp = httpx.delete(url, headers=auth(svc.keys[0]))
    assert resp.status_code == 409 and job["id"] in resp.json()["detail"], resp.text
    assert httpx.delete(url, headers=auth(svc.keys[1])).status_code == 404
    c.cancel(job["id"])
    wait_status(c, job["id"], "canceled")
    assert httpx.delete(url, headers=auth(svc.keys[0])).status_code == 204
    assert httpx.get(url, headers=auth(svc.keys[0])).status_code == 404


def race(*calls: Any) -> list[httpx.Response]:
    """The calls' answers, each call made from its own thread at the same moment."""
    answers: list[Any] = [None] * len(calls)
    go = threading.Barrier(len(calls))

    def run(i: int) -> None:
        go.wait()
        answers[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_delete_dataset_races_submissions_safely(svc: Service, sdb: Database) -> None:
    """A DELETE of a set and a POST /jobs naming it, at once: either the job exists and the
    DELETE was refused, or the set is gone and the POST was refused; never a job on a
    deleted set."""
    svc.stop_workers()  # the jobs stay queued: each one makes the set in use
    outcomes = []
    try:
        for _ in range(20):
            ds = upload(svc)
            post, delete = race(
                lambda ds=ds: httpx.post(  # type: ignore[misc]
                    f"{svc.url}/jobs",
                    json={**SHORT, "dataset": f"ds:{ds}"},
                    headers=auth(svc.keys[0]),
                    timeout=30,
                ),
                lambda ds=ds: httpx.delete(  # type: ignore[misc]
                    f"{svc.url}/datasets/{ds}", headers=auth(svc.keys[0]), timeout=30
                ),
            )
            pair = (post.status_code, delete.status_code)
            assert pair in ((201, 409), (422, 204)), (pair, post.text)
            outcomes.append(pair)
            with sdb.reader() as s:
                present = s.get(UserDataset, ds) is not None
            assert present == (pair == (201, 409))
    finally:
        svc.cancel_unfinished()
        svc.start_worker()
        svc.wait_for_workers(1)
    print("race outcomes", outcomes)


# -- retention, gc, gauges ---------------------------------------------------------------


def ended_job(
    s: Any, *, days_ago: float, status: str = "succeeded", steps: int = 40, model: int = 3000
) -> str:
    """A job that ended `days_ago` days ago with `steps` step rows, a model of `model`
    bytes and a checkpoint of 500 (one left by an older trainq)."""
    job_id = str(uuid.uuid4())
    job = new_job(job_id=job_id, spec=JobSpec(**SHORT), owner="o", idempotency_key=None)
    job.status = status
    job.finished_at = utcnow() - dt.timedelta(days=days_ago)
    s.add(job)
    s.flush()
    point = dict(epoch=1, loss=0.5, lr=1e-3, images_per_second=1e4, time=1.0)
    memory = dict(memory_allocated=2**30, memory_reserved=2**31, memory_peak=2**31)
    s.execute(
        insert(StepMetric),
        [{"job_id": job_id, "step": k, **point, **memory} for k in range(1, steps + 1)],
    )
    data = os.urandom(model)
    s.add(Artifact(job_id=job_id, format="torchscript", data=data,
                   sha256=hashlib.sha256(data).hexdigest(), size=model))  # fmt: skip
    s.add(Checkpoint(job_id=job_id, epoch=1, step=steps, data=b"c" * 500))
    return job_id


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    from tests.integration.conftest import database

    with database(request.param, tmp_path) as url, migrated(url) as db:
        yield db


def gc(db: Database, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env["TRAINQ_DATABASE_URL"] = str(db.engine.url.render_as_string(hide_password=False))
    out = subprocess.run(
        [sys.executable, "-m", "cli", "gc", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout


def snapshot(db: Database) -> tuple[int, ...]:
    with db.reader() as s:
        return (
            s.scalar(select(func.count()).select_from(StepMetric)) or 0,
            s.scalar(select(func.count()).select_from(Artifact)) or 0,
            s.scalar(select(func.count()).select_from(Checkpoint)) or 0,
            s.scalar(select(func.count()).where(Job.purged_at.is_not(None))) or 0,
        )


def test_gc_dry_run_reports_bytes_and_changes_nothing(fresh_db: Database) -> None:
    with fresh_db.writer() as s:
        for _ in range(3):
            ended_job(s, days_ago=10, steps=40, model=3000)
        ended_job(s, days_ago=10, status="failed", steps=10, model=1000)
        ended_job(s, days_ago=1)  # too young
    before = snapshot(fresh_db)
    out = gc(fresh_db, "--dry-run", "--older-than-days", "5")
    assert "would purge 4 jobs" in out, out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert lines["artifacts"][1] == "4" and lines["artifacts"][3] == str(3 * 3000 + 1000)
    assert lines["checkpoints"][1] == "4" and lines["checkpoints"][3] == str(4 * 500)
    assert lines["step_rows"][1] == "130" and lines["step_rows"][3] == str(130 * STEP_ROW_BYTES)
    assert snapshot(fresh_db) == before

    out = gc(fresh_db, "--older-than-days", "5")
    assert "purged 4 jobs" in out, out
    steps, artifacts, checkpoints, purged = snapshot(fresh_db)
    assert (steps, artifacts, purged) == (40, 1, 4)
    assert checkpoints == 0  # the young job's, an ended job's, swept too


def test_retention_pass_is_bounded_and_takes_only_old_ended_jobs(fresh_db: Database) -> None:
    with fresh_db.writer() as s:
        old = [ended_job(s, days_ago=10 + i / 100, steps=2, model=10) for i in range(130)]
        young = ended_job(s, days_ago=2)
        running = ended_job(s, days_ago=10, status="running")  # a stale finished_at
    gone = purge_batch(fresh_db, older_than_days=5, limit=100)
    assert gone.jobs == 100 and gone.rows["step_rows"] == 200
    with fresh_db.reader() as s:
        purged = set(s.scalars(select(Job.id).where(Job.purged_at.is_not(None))))
    assert purged == set(old[-100:])  # the oldest first
    assert purge_batch(fresh_db, older_than_days=5, limit=100).jobs == 30
    assert rows_of(fresh_db, young)["step_metrics"] == 40
    assert rows_of(fresh_db, running)["artifacts"] == 1


def test_the_reconciler_purges_expired_jobs(svc: Service, sdb: Database) -> None:
    with sdb.writer() as s:
        old = [ended_job(s, days_ago=RETENTION_DAYS + 1) for _ in range(10)]
        kept = ended_job(s, days_ago=RETENTION_DAYS - 1)
        s.execute(Job.__table__.update().where(Job.id.in_([*old, kept])).values(owner=None))
    wait_until(lambda: all(rows_of(sdb, j)["step_metrics"] == 0 for j in old), 60, "the purge", 0.2)
    admin = svc.client(svc.admin_key)
    job = admin.job(old[0])
    assert job["purged_at"] is not None and job["links"]["models"] == {}
    assert rows_of(sdb, old[0]) == {
        "jobs": 1, "artifacts": 0, "checkpoints": 0, "step_metrics": 0, "epoch_metrics": 0
    }  # fmt: skip
    model = httpx.get(f"{svc.url}/jobs/{old[0]}/model", headers=auth(svc.admin_key))
    assert model.status_code == 410 and "retention" in model.json()["detail"], model.text
    assert admin.job(kept)["purged_at"] is None and rows_of(sdb, kept)["artifacts"] == 1
    # The checkpoint an older trainq left with the young ended job is swept all the same.
    wait_until(lambda: rows_of(sdb, kept)["checkpoints"] == 0, 30, "the sweep", 0.2)


def test_gauges_show_the_bytes_held(svc: Service, sdb: Database) -> None:
    text = httpx.get(f"{svc.url}/metrics", headers=auth(svc.keys[0])).text
    gauges = {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("trainq_stored_bytes{")
    }
    with sdb.reader() as s:
        artifacts = s.scalar(select(func.sum(Artifact.size))) or 0
        datasets = s.scalar(select(func.sum(UserDataset.size))) or 0
        checkpoints = s.scalar(select(func.sum(func.length(Checkpoint.data)))) or 0
        steps = s.scalar(select(func.count()).select_from(StepMetric)) or 0
    assert gauges["artifacts"] == artifacts > 0
    assert gauges["datasets"] == datasets
    assert gauges["checkpoints"] == checkpoints
    if sdb.local:  # SQLite: the count times the measured size of a row
        assert gauges["step_rows"] == steps * STEP_ROW_BYTES
    else:  # PostgreSQL's own size of the table and its index (dead rows until a vacuum)
        assert gauges["step_rows"] >= steps * 60


# -- a 200 MB model, streamed -------------------------------------------------------------


@pytest.mark.slow
def test_a_200_mb_model_downloads_with_flat_memory(svc: Service, sdb: Database) -> None:
    data = os.urandom(200 * 2**20)
    sha = hashlib.sha256(data).hexdigest()
    with sdb.writer() as s:
        job_id = ended_job(s, days_ago=0, steps=1, model=1)
        s.execute(Job.__table__.update().where(Job.id == job_id).values(owner=None))
        s.execute(
            Artifact.__table__.update()
            .where(Artifact.job_id == job_id)
            .values(data=data, sha256=sha, size=len(data))
        )
    del data

    def download() -> tuple[int, str, str]:
        digest, n = hashlib.sha256(), 0
        with httpx.stream(
            "GET", f"{svc.url}/jobs/{job_id}/model", headers=auth(svc.admin_key), timeout=120
        ) as resp:
            assert resp.status_code == 200, resp.read()
            for chunk in resp.iter_bytes():
                digest.update(chunk)
                n += len(chunk)
            return n, digest.hexdigest(), resp.headers["etag"]

    (size, got, etag), growth = peak_growth_mib(svc.api.pid, download)
    assert (size, got, etag) == (200 * 2**20, sha, f'"{sha}"')
    assert growth < 40, f"the API grew {growth} MiB for a 200 MiB download"
    head = httpx.head(f"{svc.url}/jobs/{job_id}/model", headers=auth(svc.admin_key))
    assert head.headers["content-length"] == str(200 * 2**20)


def test_the_step_row_estimate_is_what_sqlite_takes(tmp_path: Path) -> None:
    """The gauge's bytes per step row on SQLite, against the pages 20,000 rows take."""
    with migrated(f"sqlite:///{tmp_path / 'size.db'}") as db:

        def used() -> int:
            with db.reader() as s:
                pages = s.scalar(text("PRAGMA page_count")) - s.scalar(
                    text("PRAGMA freelist_count")
                )
                return int(pages * s.scalar(text("PRAGMA page_size")))

        before = used()
        with db.writer() as s:
            for _ in range(20):
                ended_job(s, days_ago=0, steps=1000, model=1)
        grown = used() - before
    assert 0.75 * STEP_ROW_BYTES * 20_000 <= grown <= 1.25 * STEP_ROW_BYTES * 20_000 + 2**20


def test_a_damaged_model_is_refused_before_its_response_starts(svc: Service, sdb: Database) -> None:
    """The stored bytes no longer match their sha256: the download says so, with no byte
    of the model, instead of a 200 cut short that a client could take for the model."""
    data = os.urandom(3 * 2**20 + 5)
    with sdb.writer() as s:
        job_id = ended_job(s, days_ago=0, steps=1, model=1)
        s.execute(Job.__table__.update().where(Job.id == job_id).values(owner=None))
        s.execute(
            Artifact.__table__.update()
            .where(Artifact.job_id == job_id)
            .values(data=data, sha256=hashlib.sha256(data[:-1] + b"!").hexdigest(), size=len(data))
        )
    resp = httpx.get(f"{svc.url}/jobs/{job_id}/model", headers=auth(svc.admin_key), timeout=60)
    assert resp.status_code == 500, resp.text[:200]
    assert "failed its sha256 check" in resp.json()["detail"]

"""The fault suite: real processes killed and restarted on loopback, each case bounded in
time. Every case asserts the final status and error code, and that finished jobs keep their
model and every metric step exactly once.

Timings are shortened for the suite: a job is lost after 4 s without a heartbeat, and
workers reconcile every second (the defaults are 30 s and 10 s)."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from client.http import ApiError, Client
from core.db import Database
from core.spec import JobSpec
from core.store import create_job, get_job
from tests.faults.process_tree import horses, rq_workers
from tests.recovery import FAST_RECOVERY, SPEC, STEPS
from tests.service import Service, fresh_service, kill_group, status_of, wait_until

RECOVERY = FAST_RECOVERY | {"TRAINQ_DB_BUSY_TIMEOUT_S": "1"}  # cases here lock SQLite


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    """A fresh service per case (these tests break things); workers are started by each case."""
    with fresh_service(tmp_path, data_dir, RECOVERY) as service:
        yield service


def admin(svc: Service) -> Client:
    return svc.client(svc.admin_key)


def wait_status(c: Client, job_id: str, want: str, timeout: float = 120) -> dict:
    wait_until(lambda: status_of(c, job_id) == want, timeout, f"job {job_id} to be {want}", 0.2)
    return c.job(job_id)


def wait_step(c: Client, job_id: str, step: int, timeout: float = 120) -> None:
    def reached() -> bool:
        try:
            return c.job(job_id)["progress"]["step"] >= step
        except ApiError:
            return False

    wait_until(reached, timeout, f"job {job_id} to pass step {step}", 0.1)


def assert_intact(c: Client, job: dict, tmp_path: Path, steps: int) -> None:
    """A finished job: its model downloads (sha256 checked) and every step is there once."""
    items = c.metrics(job["id"], limit=5000)["items"]
    assert [p["step"] for p in items] == list(range(1, steps + 1))
    assert all(math.isfinite(p["loss"]) for p in items)
    assert [e["epoch"] for e in c.epochs(job["id"])] == list(range(1, job["spec"]["epochs"] + 1))
    sha = c.download(job["id"], tmp_path / f"{job['id']}.pt").sha256
    assert len(sha) == 64


@pytest.fixture
def ref(svc: Service, worker: subprocess.Popen[bytes]) -> dict:
    """SPEC trained undisturbed on the case's first worker: what a resumed job must match."""
    c = svc.client()
    return wait_status(c, c.submit(SPEC | {"max_restarts": 0})["id"], "succeeded")


def test_kill_9_worker_mid_epoch_resumes_on_another_worker(
    svc: Service, tmp_path: Path, worker: subprocess.Popen[bytes], ref: dict
) -> None:
    c = svc.client()
    job = c.submit(SPEC)
    wait_step(c, job["id"], 32 + 10)  # mid epoch 2, after epoch 1's checkpoint
    kill_group(worker)  # launcher, RQ worker and work horse
    svc.start_worker()
    done = wait_status(c, job["id"], "succeeded")
    assert done["attempt"] == 2
    assert_intact(c, done, tmp_path, STEPS)
    # Resumed from the checkpoint with the same data order and RNG: the same result.
    assert abs(done["result"]["test_accuracy"] - ref["result"]["test_accuracy"]) <= 0.005


def test_kill_9_only_the_work_horse(
    svc: Service, tmp_path: Path, worker: subprocess.Popen[bytes]
) -> None:
    c = svc.client()
    job = c.submit(SPEC)
    wait_step(c, job["id"], 40)
    [rq_worker] = rq_workers(worker.pid)
    [horse] = horses(rq_worker)
    os.kill(horse, signal.SIGKILL)
    done = wait_status(c, job["id"], "succeeded")
    assert done["attempt"] == 2
    assert_intact(c, done, tmp_path, STEPS)


def follow(svc: Service, job_id: str) -> tuple[list[dict], list[Exception], threading.Thread]:
    """Every SSE event of a job, collected live by a thread until the stream ends (or the
    error that ended it)."""
    events: list[dict] = []
    errors: list[Exception] = []
    c = svc.client()

    def collect() -> None:
        try:
            events.extend(c.events(job_id))
        except Exception as e:  # reported by the test, not lost in the thread
            errors.append(e)

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    return events, errors, thread


def test_sigterm_preempts_mid_epoch_and_the_job_resumes_at_once_elsewhere(
    svc: Service, tmp_path: Path, worker: subprocess.Popen[bytes], ref: dict
) -> None:
    c = svc.client()
    job = c.submit(SPEC | {"max_restarts": 0})  # a counted restart would fail it
    events, errors, follower = follow(svc, job["id"])
    wait_step(c, job["id"], 32 + 10)  # mid epoch 2
    svc.start_worker()
    svc.wait_for_workers(2)
    admin = svc.client(svc.admin_key)  # worker names are for admin keys
    stopped = admin.job(job["id"])
    worker.send_signal(signal.SIGTERM)  # to the launcher, as docker stop does
    worker.wait(timeout=10)  # within the grace period before SIGKILL
    wait_until(
        lambda: (j := admin.job(job["id"]))["attempt"] == 2 and j["worker"] != stopped["worker"],
        10,
        "the job to run on the other worker",
        0.1,
    )
    done = wait_status(c, job["id"], "succeeded")
    assert done["attempt"] == 2
    assert_intact(c, done, tmp_path, STEPS)
    follower.join(timeout=60)
    assert not follower.is_alive() and errors == []
    assert [e["data"]["step"] for e in events if e["event"] == "step"] == list(range(1, STEPS + 1))
    [resumed] = [
        e["data"] for e in events if e["event"] == "status" and e["data"].get("attempt") == 2
    ]
    # From a mid-epoch checkpoint at or after the step seen before SIGTERM, not epoch 1's.
    assert resumed["resumed_from_step"] >= stopped["progress"]["step"]
    db = Database(svc.database_url)
    with db.writer() as s:
        row = get_job(s, job_id=job["id"])
        assert row is not None and row.preemptions == 1
    db.dispose()
    # The same data order, weights and RNG: the uninterrupted run's result, exactly.
    assert done["result"]["test_accuracy"] == ref["result"]["test_accuracy"]
    assert done["result"]["test_loss"] == ref["result"]["test_loss"]


def test_a_lost_job_fails_worker_lost_after_max_restarts(
    svc: Service, worker: subprocess.Popen[bytes]
) -> None:
    c = svc.client()
    job = c.submit(SPEC | {"max_restarts": 0, "epochs": 20})
    wait_step(c, job["id"], 5)
    kill_group(worker)
    svc.start_worker()  # its launcher reconciles
    done = wait_status(c, job["id"], "failed", timeout=60)
    assert done["error"]["code"] == "worker_lost"
    assert "max_restarts" in done["error"]["message"]


@pytest.mark.usefixtures("worker")
def test_kill_9_api_mid_job_sse_resumes(svc: Service, tmp_path: Path) -> None:
    c = svc.client()
    job = c.submit(SPEC)
    events = []
    for event in c.events(job["id"]):
        events.append(event)
        if event["event"] == "step" and event["data"]["step"] == 20:
            assert svc.api is not None
            kill_group(svc.api)
            time.sleep(1)
            svc.start_api()  # the client reconnects with Last-Event-ID by itself
    steps = [e["data"]["step"] for e in events if e["event"] == "step"]
    assert steps == list(range(1, STEPS + 1))
    assert events[-1]["data"]["status"] == "succeeded"
    assert_intact(c, c.job(job["id"]), tmp_path, STEPS)


@pytest.mark.usefixtures("worker")
def test_redis_kill_9_and_restart_with_aof(svc: Service, tmp_path: Path) -> None:
    c = svc.client()
    job = c.submit(SPEC)
    wait_step(c, job["id"], 20)
    svc.redis.kill()
    r = httpx.get(f"{svc.url}/jobs/{job['id']}", headers={"Authorization": f"Bearer {svc.keys[0]}"})
    assert r.status_code == 503 and r.headers["retry-after"]
    r = httpx.post(f"{svc.url}/jobs", json=SPEC, headers={"Authorization": f"Bearer {svc.keys[0]}"})
    assert r.status_code == 503
    time.sleep(2)
    svc.redis.start()  # same port, same folder: the AOF brings the queue back
    done = wait_status(c, job["id"], "succeeded")
    assert done["attempt"] in (1, 2)
    assert_intact(c, done, tmp_path, STEPS)
    # The request refused during the outage left no job behind.
    assert [j["id"] for j in c.jobs()] == [job["id"]]


def test_redis_restarted_empty_requeues_queued_jobs(svc: Service, tmp_path: Path) -> None:
    c = svc.client()
    job = c.submit(SPEC | {"epochs": 1})  # no worker yet: it waits in the queue
    svc.redis.kill()
    for f in svc.redis.folder.rglob("*"):
        if f.is_file():
            f.unlink()
    svc.redis.start()
    svc.start_worker()
    done = wait_status(c, job["id"], "succeeded")
    assert_intact(c, done, tmp_path, 32)


def test_crash_between_insert_and_enqueue_is_healed(svc: Service, tmp_path: Path) -> None:
    job_id = str(uuid.uuid4())
    db = Database(svc.database_url)
    with db.writer() as s:  # what the API had written when it died before enqueueing
        create_job(s, job_id=job_id, spec=JobSpec(epochs=1, batch_size=128), owner=None)
    db.dispose()
    svc.start_worker()
    done = wait_status(admin(svc), job_id, "succeeded")
    assert done["attempt"] == 1
    assert_intact(admin(svc), done, tmp_path, 32)


DUPLICATE = """
import sys
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer
url, queue, job_id = sys.argv[1:4]
q = Queue(queue, connection=Redis.from_url(url), serializer=JSONSerializer)
spec = {"epochs": 1, "batch_size": 128}
q.enqueue("worker.tasks.train", spec=spec, job_id=job_id)
q.enqueue_call(
    "worker.tasks.train", kwargs={"spec": spec, "job_id": job_id}, job_id=job_id + "-dup"
)
"""


def test_a_job_delivered_twice_runs_once(svc: Service, tmp_path: Path) -> None:
    job_id = str(uuid.uuid4())
    subprocess.run([sys.executable, "-c", DUPLICATE, svc.redis.url, svc.queue, job_id], check=True)
    svc.start_worker()
    svc.start_worker()
    done = wait_status(admin(svc), job_id, "succeeded")
    time.sleep(2)  # give the duplicate its chance to run
    done = admin(svc).job(job_id)
    assert done["attempt"] == 1
    assert_intact(admin(svc), done, tmp_path, 32)


def test_sqlite_locked_beyond_its_timeout_is_503(svc: Service) -> None:
    db_file = svc.database_url.removeprefix("sqlite:///")
    lock = sqlite3.connect(db_file, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        r = httpx.post(
            f"{svc.url}/jobs",
            json=SPEC,
            headers={"Authorization": f"Bearer {svc.keys[0]}"},
            timeout=30,
        )
        assert r.status_code == 503 and r.headers["retry-after"]
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert svc.client().submit(SPEC | {"max_steps": 1})["status"] == "queued"


def test_nan_loss_fails_diverged_without_nan_in_metrics(svc: Service) -> None:
    c = svc.client()
    svc.start_worker()
    job = c.submit(
        {"epochs": 2, "optimizer": "sgd", "lr": 10, "momentum": 0.99, "scheduler": "none"}
    )
    done = wait_status(c, job["id"], "failed")
    assert done["error"]["code"] == "diverged"
    raw = httpx.get(
        f"{svc.url}/jobs/{job['id']}/metrics", headers={"Authorization": f"Bearer {svc.keys[0]}"}
    ).text
    items = json.loads(raw)["items"]  # strict JSON: NaN would not parse as a number here
    assert "NaN" not in raw and "Infinity" not in raw
    assert all(math.isfinite(p["loss"]) for p in items)


def test_out_of_memory_fails_with_figures_and_advice(svc: Service) -> None:
    c = svc.client()
    svc.start_worker(data_limit=3 << 30)  # a worker with 3 GiB of data memory
    job = c.submit({"epochs": 1, "batch_size": 1500, "conv1_channels": 512})  # under the bound
    done = wait_status(c, job["id"], "failed")
    assert done["error"]["code"] == "out_of_memory"
    assert "batch_size 1500" in done["error"]["message"]
    assert "smaller batch_size" in done["error"]["message"]
    assert done["attempt"] == 1  # no retry loop


def test_max_duration_fails_with_timeout(svc: Service) -> None:
    c = svc.client()
    svc.start_worker()
    job = c.submit({"epochs": 50, "max_duration_s": 2})
    done = wait_status(c, job["id"], "failed")
    assert done["error"]["code"] == "timeout"


def test_hostile_requests_get_4xx(svc: Service) -> None:
    auth = {"Authorization": f"Bearer {svc.keys[0]}"}
    big = httpx.post(
        f"{svc.url}/jobs",
        content=b"{" + b" " * (20 << 20) + b"}",
        headers={**auth, "content-type": "application/json"},
    )
    assert big.status_code == 413
    chunked = httpx.post(
        f"{svc.url}/jobs",
        content=iter([b'{"epochs": 1}']),
        headers={**auth, "content-type": "application/json"},
    )
    assert chunked.status_code in (201, 411)
    for raw in (b'{"lr": NaN}', b'{"lr": -Infinity}', b"[]", b'"x"', b"{"):
        r = httpx.post(
            f"{svc.url}/jobs", content=raw, headers={**auth, "content-type": "application/json"}
        )
        assert r.status_code == 422, raw
    for path in ("/jobs/..%2F..%2Fetc%2Fpasswd", "/jobs/%00", "/jobs/" + "a" * 5000):
        r = httpx.get(f"{svc.url}{path}", headers=auth)
        assert r.status_code in (404, 414, 422), path


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cancel_of_a_stuck_job_falls_back_to_rqs_stop_command(
    svc: Service, worker: subprocess.Popen[bytes]
) -> None:
    c = svc.client()
    job = c.submit(SPEC | {"epochs": 20})
    wait_step(c, job["id"], 10)
    [rq_worker] = rq_workers(worker.pid)
    [horse] = horses(rq_worker)
    os.kill(horse, signal.SIGSTOP)  # stuck: it can no longer see the cooperative cancel
    c.cancel(job["id"])
    done = wait_status(c, job["id"], "canceled", timeout=60)
    assert done["error"]["code"] == "canceled"
    wait_until(lambda: not _alive(horse), 30, "the stuck work horse to be stopped", 0.2)
    # The worker is free again and runs the next job.
    after = c.submit(SPEC | {"epochs": 1})
    assert wait_status(c, after["id"], "succeeded")["attempt"] == 1

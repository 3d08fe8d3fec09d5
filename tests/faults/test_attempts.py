"""Every attempt ends, and only a dead or hung one is declared lost: real worker processes,
a real SQLite file and redis-server, each case bounded in time.

Timings are shortened: a job is lost after 3 s without a heartbeat, and workers reconcile
every second, so an attempt that beats only from its step blocks would be lost in any
step-free phase of a few seconds."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

from client.http import ApiError, Client
from core.datasets import ParsedDataset
from core.db import Database
from core.spec import JobSpec
from core.store import claim_job, create_dataset, create_job, get_job, save_epoch
from core.train import train
from core.train.data import load_dataset
from tests.conftest import Recorder
from tests.faults.process_tree import horses, rq_workers
from tests.service import Service, fresh_service, postgres_database, wait_until
from tests.wire import WireProxy

RECOVERY = {
    "TRAINQ_HEARTBEAT_TIMEOUT_S": "3",
    "TRAINQ_RECONCILE_INTERVAL_S": "1",
    "TRAINQ_QUEUE_GRACE_S": "2",
    "TRAINQ_DB_BUSY_TIMEOUT_S": "1",
}
ENDED = ("succeeded", "failed", "canceled")
# One step, then an evaluation of the 1,000 test digits with wide convolutions: several times
# the 3 s heartbeat timeout without a step.
LONG_EVALUATION = {
    "epochs": 1,
    "max_steps": 1,
    "batch_size": 8,
    "conv1_channels": 256,
    "conv2_channels": 1024,
    "hidden": 16,
}


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    with fresh_service(tmp_path, data_dir, RECOVERY) as service:
        yield service


def ended(c: Client, job_id: str, timeout: float = 120) -> dict:
    """The job once it has ended, whichever way."""

    def status() -> str | None:
        try:
            return str(c.job(job_id)["status"])
        except ApiError:
            return None

    wait_until(lambda: status() in ENDED, timeout, f"job {job_id} to end", 0.2)
    return c.job(job_id)


def store_lost_attempt(db: Database, job_id: str, run: Recorder) -> None:
    """What a worker's attempt stored, epoch by epoch (its steps, metrics and checkpoint,
    from the real trainer, through the real store), before it died in export."""
    with db.writer() as s:
        claim_job(s, job_id=job_id, worker="a-host-that-died", device="cpu")
    stored = 0
    for m, (_, blob) in zip(run.epochs, run.checkpoints, strict=True):
        steps = [p for p in run.steps if stored < p.step <= m.step]
        with db.writer() as s:
            save_epoch(s, job_id=job_id, attempt=1, epoch=m, steps=steps, checkpoint=blob)
        stored = m.step


def test_a_job_lost_after_its_last_checkpoint_resumes_and_succeeds(
    svc: Service, tmp_path: Path
) -> None:
    spec = JobSpec(epochs=2, batch_size=256, seed=7)  # 16 steps an epoch
    job_id = str(uuid.uuid4())
    db = Database(svc.database_url)
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=spec, owner=None)
    run = Recorder()
    train(spec, data_dir=svc.data_dir, callbacks=run.callbacks())
    store_lost_attempt(db, job_id, run)
    db.dispose()

    svc.start_worker()  # its reconciler finds the silent attempt and requeues it
    c = svc.client(svc.admin_key)
    done = ended(c, job_id)
    assert (done["status"], done["attempt"]) == ("succeeded", 2), done["error"]
    assert done["result"]["epochs"] == 2 and done["result"]["steps"] == 32
    assert done["result"]["test_accuracy"] == run.epochs[-1].test_accuracy
    items = c.metrics(job_id, limit=5000)["items"]
    assert [p["step"] for p in items] == list(range(1, 33))
    assert [e["epoch"] for e in c.epochs(job_id)] == [1, 2]
    assert len(c.download(job_id, tmp_path / "model.pt").sha256) == 64


def insert_dataset(svc: Service, x: np.ndarray, y: np.ndarray, n_test: int) -> str:
    """A data set row as stored, bypassing today's upload checks (as a row written by an
    older version would be)."""
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        x_train=x[n_test:],
        y_train=y[n_test:],
        x_test=x[:n_test],
        y_test=y[:n_test],
        num_classes=np.int64(10),
    )
    blob = buf.getvalue()
    ds_id = str(uuid.uuid4())
    db = Database(svc.database_url)
    with db.writer() as s:
        stored = ParsedDataset(
            npz=blob,
            sha256=hashlib.sha256(blob).hexdigest(),
            image_shape=(x.shape[1], x.shape[2], x.shape[3]),
            num_classes=10,
            train_count=len(y) - n_test,
            test_count=n_test,
            classes=None,
        )
        create_dataset(s, dataset_id=ds_id, owner=None, name="stored-without-checks", parsed=stored)
    db.dispose()
    return f"ds:{ds_id}"


def test_an_unexpected_error_fails_the_job_at_once_with_code_internal(
    svc: Service, data_dir: Path
) -> None:
    digits = load_dataset("mnist-sample", data_dir).train
    x = digits.images[::6].numpy()  # every class (the digits are stored class by class)
    y = digits.labels[::6].numpy() + 5  # labels past num_classes: cross entropy's IndexError
    dataset = insert_dataset(svc, x, y, n_test=128)
    svc.start_worker()
    c = svc.client(svc.admin_key)
    job = c.submit({"dataset": dataset, "epochs": 1, "batch_size": 64})
    done = ended(c, job["id"], timeout=90)
    assert (done["status"], done["error"]["code"], done["attempt"]) == ("failed", "internal", 1)
    message = done["error"]["message"]
    assert "IndexError" in message and "out of bounds" in message
    assert "Traceback" not in message
    log = "".join(p.read_text() for p in svc.data_dir.parent.glob("worker*.log"))
    assert "Traceback" in log and job["id"] in log  # the traceback goes to the log


def test_out_of_memory_while_building_the_model_is_out_of_memory(svc: Service) -> None:
    # fc1 alone is 50,176 x 8,192 floats (1.6 GB): past the limit before any step runs.
    svc.start_worker(data_limit=2 << 30)
    c = svc.client()
    job = c.submit({"epochs": 1, "conv2_channels": 1024, "hidden": 8192})
    done = ended(c, job["id"], timeout=90)
    assert (done["status"], done["error"]["code"], done["attempt"]) == (
        "failed",
        "out_of_memory",
        1,
    )
    assert "smaller batch_size" in done["error"]["message"]


def test_a_step_free_phase_longer_than_the_heartbeat_timeout_is_not_lost(
    svc: Service, tmp_path: Path
) -> None:
    svc.start_worker()
    c = svc.client()
    job = c.submit(LONG_EVALUATION)
    done = ended(c, job["id"], timeout=240)
    assert (done["status"], done["attempt"]) == ("succeeded", 1), done["error"]
    assert done["result"]["steps"] == 1
    assert len(c.download(job["id"], tmp_path / "model.pt").sha256) == 64


def job_row(svc: Service, job_id: str) -> tuple[int | None, int]:
    """(stop_requested_attempt, preemptions) as the database has them."""
    db = Database(svc.database_url)
    try:
        with db.writer() as s:
            job = get_job(s, job_id=job_id)
            assert job is not None
            return job.stop_requested_attempt, job.preemptions
    finally:
        db.dispose()


def test_a_worker_stopped_outside_the_step_loop_then_killed_is_a_preemption(
    svc: Service,
) -> None:
    """max_restarts 0. The worker is drained during the evaluation after the job's one step:
    its work horse gets SIGTERM (as worker.rq_worker sends it), and SIGKILL follows before any
    step could hand the job back. That loss is a preemption, not a restart: the job runs
    again and succeeds."""
    launcher = svc.start_worker()
    c = svc.client()
    job = c.submit(LONG_EVALUATION | {"max_restarts": 0})
    wait_until(
        lambda: c.job(job["id"])["progress"]["step"] >= 1, 120, "the one step (evaluation next)"
    )
    [rq_worker] = rq_workers(launcher.pid)
    [horse] = horses(rq_worker)
    os.kill(horse, signal.SIGTERM)
    wait_until(lambda: job_row(svc, job["id"])[0] == 1, 10, "the stop request in the job row")
    os.kill(horse, signal.SIGKILL)  # the launcher's, after its grace period
    done = ended(c, job["id"], timeout=300)
    assert (done["status"], done["attempt"]) == ("succeeded", 2), done["error"]
    assert job_row(svc, job["id"]) == (1, 1)


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_database()


def test_a_database_connection_lost_in_an_epoch_write_is_waited_out(
    tmp_path: Path, data_dir: Path, pg_url: str
) -> None:
    where = urlsplit(pg_url)
    proxy = WireProxy(where.port or 5432).start()
    # The checkpoint's INSERT runs, its reply is lost and the connection cut: the worker's
    # session is gone mid-transaction, as in a server restart or a failover.
    proxy.drop_reply(b"INSERT INTO checkpoints", 1)
    try:
        with fresh_service(tmp_path, data_dir, RECOVERY, api=False) as svc:
            svc.database_url = pg_url.replace(
                where.netloc, f"{where.username}@127.0.0.1:{proxy.port}"
            )
            svc.migrate()
            svc.start_api()
            svc.start_worker()
            c = svc.client()
            job = ended(c, str(c.submit({"epochs": 1, "max_steps": 3})["id"]), timeout=240)
            assert proxy.dropped == 1
            assert job["status"] == "succeeded", job
            assert job["attempt"] == 1  # waited out in the attempt, not lost and requeued
            assert [e["epoch"] for e in c.epochs(job["id"])] == [1]
    finally:
        proxy.close()

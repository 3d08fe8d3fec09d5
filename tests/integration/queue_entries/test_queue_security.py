"""The queue is an API: a worker runs only `worker.tasks.train`, with the payload that the
contract in core.queue names. Any other entry is failed in RQ with the reason, nothing of it
runs, and the worker goes on to the next one. Secrets and host names stay off the wire."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from redis import Redis
from rq import Callback, Queue, Retry
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.webhook import Webhook

from api.auth import owner_id
from client.http import ApiError
from core.datasets import canonical
from core.db import Database
from core.queue import RESULT_TTL_S
from core.spec import JobSpec
from core.store import create_dataset, create_job
from tests.integration.queue_entries.entries import (
    ENDED,
    SPEC,
    TASK,
    assert_refused,
    ended,
    rq_queue,
)
from tests.service import RedisServer, Service, descendants, wait_until

pytestmark = pytest.mark.slow  # real workers and services: the full run, not --fast


def test_a_shell_command_on_the_queue_never_runs(svc: Service, r: Redis, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    entry = str(uuid.uuid4())
    rq_queue(svc, r).enqueue("os.system", f"touch {marker}", job_id=entry)
    ended(r, entry)
    assert not marker.exists()
    assert_refused(svc, r, entry, "only worker.tasks.train runs on a trainq worker")


Enqueue = Callable[[Queue, str], object]
REFUSED: dict[str, tuple[Enqueue, str]] = {
    "on_success": (
        lambda q, e: q.enqueue(TASK, spec=SPEC, job_id=e, on_success=Callback("os.system")),
        "callbacks are refused: ['os.system']",
    ),
    "on_failure": (
        lambda q, e: q.enqueue(TASK, spec=SPEC, job_id=e, on_failure=Callback("os.system")),
        "callbacks are refused: ['os.system']",
    ),
    "on_stopped": (
        lambda q, e: q.enqueue(TASK, spec=SPEC, job_id=e, on_stopped=Callback("os.system")),
        "callbacks are refused: ['os.system']",
    ),
    "webhook": (
        lambda q, e: q.enqueue(
            TASK, spec=SPEC, job_id=e, webhooks=[Webhook("http://127.0.0.1:9/", "finished")]
        ),
        "webhooks are refused",
    ),
    "rq retry": (
        lambda q, e: q.enqueue(TASK, spec=SPEC, job_id=e, retry=Retry(max=2)),
        "RQ retries and repeats are refused",
    ),
    "positional args": (
        lambda q, e: q.enqueue_call(TASK, args=[SPEC], job_id=e),
        "positional arguments are refused",
    ),
    "bad job_id": (
        lambda q, e: q.enqueue_call(
            TASK, kwargs={"spec": SPEC, "job_id": "../../etc"}, job_id=f"{e}-a2"
        ),
        "job_id= must be a UUID",
    ),
    "oversized spec": (
        lambda q, e: q.enqueue_call(TASK, kwargs={"spec": {"dataset": "x" * 20_000}}, job_id=e),
        "bytes as JSON; at most 16384",
    ),
    "too deep a spec": (
        lambda q, e: q.enqueue_call(
            TASK, kwargs={"spec": {"a": {"b": {"c": {"d": {"e": 1}}}}}}, job_id=e
        ),
        "spec= nests deeper than 4 levels",
    ),
    "non-string owner": (
        lambda q, e: q.enqueue_call(TASK, kwargs={"spec": SPEC, "owner": 123}, job_id=e),
        "owner= must be a string",
    ),
    "unknown keyword": (
        lambda q, e: q.enqueue_call(TASK, kwargs={"spec": SPEC, "cwd": "/"}, job_id=e),
        "unknown keywords ['cwd']",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_entry_outside_the_contract_is_failed_with_its_reason(
    svc: Service, r: Redis, case: str
) -> None:
    enqueue, reason = REFUSED[case]
    entry = str(uuid.uuid4())
    enqueue(rq_queue(svc, r), entry)
    if case == "bad job_id":
        assert_refused(svc, r, f"{entry}-a2", reason, job_id=entry)
    else:
        assert_refused(svc, r, entry, reason)


def test_an_entry_id_that_is_no_uuid_is_refused(svc: Service, r: Redis) -> None:
    rq_queue(svc, r).enqueue_call(TASK, kwargs={"spec": SPEC}, job_id="not-a-uuid")
    job = ended(r, "not-a-uuid")
    assert job.get_status() == JobStatus.FAILED
    result = job.latest_result()
    assert result is not None and "is not a UUID" in (result.exc_string or "")


@pytest.fixture(scope="module")
def trained(svc: Service) -> str:
    """A job of key alice's, run to the end by the worker that refused all the above."""
    c = svc.client()
    job_id = str(c.submit(SPEC)["id"])
    wait_until(lambda: c.job(job_id)["status"] == "succeeded", 90, "the job", interval=0.2)
    return job_id


def test_the_worker_still_runs_a_normal_job_after_refusing(svc: Service, trained: str) -> None:
    job = svc.client().job(trained)
    assert job["status"] == "succeeded" and job["progress"]["step"] == 3


def test_the_run_record_names_the_host_to_admins_only(svc: Service, trained: str) -> None:
    assert "host" not in svc.client().record(trained)
    assert svc.client(svc.admin_key).record(trained)["host"]


def test_the_redis_password_is_on_no_worker_command_line(
    service_data_dir: Path, tmp_path: Path
) -> None:
    """A redis-server of its own that asks for a password; the worker launcher and the RQ
    worker it starts get the URL by environment, never in /proc/<pid>/cmdline."""
    locked = RedisServer(tmp_path / "redis")
    locked.start()
    password = f"pw-{uuid.uuid4().hex}"
    locked.client().config_set("requirepass", password)
    url = f"redis://:{password}@127.0.0.1:{locked.port}/0"
    svc = Service(
        data_dir=service_data_dir,
        database_url=f"sqlite:///{tmp_path / 'trainq.db'}",
        redis=locked,
        extra_env={"TRAINQ_REDIS_URL": url},
    )
    try:
        svc.up(workers=1)  # registered: the worker reached Redis with the password
        launcher = svc.workers[0]
        procs = [launcher.pid, *descendants(launcher.pid)]
        assert len(procs) >= 2  # the launcher and its RQ worker
        for pid in procs:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert password.encode() not in cmdline, cmdline
    finally:
        svc.stop()
        locked.kill()


def test_the_time_limit_and_ttls_are_the_workers_own(svc: Service, r: Redis) -> None:
    """An entry that asks for a 1 s limit (RQ would kill its work horse mid-training) and for
    results kept for ever: the worker applies trainq's job_timeout_s and RESULT_TTL_S."""
    entry = str(uuid.uuid4())
    rq_queue(svc, r).enqueue_call(
        TASK, kwargs={"spec": {"epochs": 1}}, job_id=entry, timeout=1, result_ttl=-1, failure_ttl=-1
    )
    job = Job.fetch(entry, connection=r, serializer=JSONSerializer)
    wait_until(lambda: job.get_status() in ENDED, 120, "the entry to end", 0.2)
    assert svc.client(svc.admin_key).job(entry)["status"] == "succeeded"
    assert job.get_status() == JobStatus.FINISHED
    assert 0 < r.ttl(job.key) <= RESULT_TTL_S


def run_to_its_end(r: Redis, entry: str) -> Job:
    """An entry that trains, once RQ has ended it."""
    job = Job.fetch(entry, connection=r, serializer=JSONSerializer)
    wait_until(lambda: job.get_status() in ENDED, 120, f"queue entry {entry} to end", 0.2)
    return job


def queued_row(svc: Service, spec: dict, owner: str | None = None) -> str:
    """A job row as the API leaves it (queued, its entry its own id), with nothing on the
    queue yet."""
    job_id = str(uuid.uuid4())
    db = Database(svc.database_url)
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec.model_validate(spec), owner=owner)
    db.dispose()
    return job_id


def test_an_entry_made_up_for_a_queued_job_claims_nothing(svc: Service, r: Redis) -> None:
    victim = queued_row(svc, SPEC, owner=owner_id(svc.keys[1]))
    entry = f"{victim}-x1"
    rq_queue(svc, r).enqueue_call(
        TASK,
        kwargs={"spec": {"epochs": 1, "max_steps": 1, "hidden": 1}, "job_id": victim},
        job_id=entry,
    )
    assert run_to_its_end(r, entry).return_value() == {"status": "skipped"}
    job = svc.client(svc.admin_key).job(victim)
    assert job["status"] == "queued" and job["attempt"] == 0


def assert_runs_nothing_of_a_deleted_job(
    svc: Service, r: Redis, job_id: str, entry: str, payload: dict[str, object]
) -> None:
    """The entry, pushed back on the queue, is refused as one whose job was deleted, and
    no job is made again from it."""
    rq_queue(svc, r).enqueue_call(TASK, kwargs=payload, job_id=entry)
    assert run_to_its_end(r, entry).return_value() == {
        "status": "refused",
        "error": "the job of this entry was deleted",
    }
    with pytest.raises(ApiError) as e:
        svc.client(svc.admin_key).job(job_id)
    assert e.value.status == 404


def test_a_requeue_entry_of_a_deleted_job_runs_nothing(svc: Service, r: Redis) -> None:
    """A requeue's entry (`<job>-a1`, naming its job) whose row was deleted while it
    waited."""
    ghost = str(uuid.uuid4())
    payload = {"spec": SPEC, "owner": owner_id(svc.keys[0]), "job_id": ghost}
    assert_runs_nothing_of_a_deleted_job(svc, r, ghost, f"{ghost}-a1", payload)


def test_the_entry_of_a_job_deleted_after_a_worker_took_it_runs_nothing(
    svc: Service, r: Redis
) -> None:
    """A job deleted (DELETE /jobs/{id}) while a worker held its entry, not yet admitted:
    the entry, under the job's own id."""
    alice = svc.client(svc.keys[0])
    job_id = str(alice.submit(SPEC)["id"])
    wait_until(lambda: alice.job(job_id)["status"] == "succeeded", 60, "the job to end")
    alice.delete(job_id)
    payload = {"spec": SPEC, "owner": owner_id(svc.keys[0])}
    assert_runs_nothing_of_a_deleted_job(svc, r, job_id, job_id, payload)


def test_a_job_with_a_row_trains_the_rows_spec_not_its_entrys(svc: Service, r: Redis) -> None:
    job_id = queued_row(svc, {**SPEC, "hidden": 24}, owner=owner_id(svc.keys[1]))
    sent = {"epochs": 1, "max_steps": 1, "hidden": 1}
    rq_queue(svc, r).enqueue_call(
        TASK, kwargs={"spec": sent, "owner": owner_id(svc.keys[0])}, job_id=job_id
    )
    run_to_its_end(r, job_id)
    bob = svc.client(svc.keys[1])
    job = bob.job(job_id)
    assert job["status"] == "succeeded", job
    assert job["result"]["steps"] == SPEC["max_steps"]
    assert bob.record(job_id)["spec"]["hidden"] == 24


def stored_dataset(svc: Service, owner: str) -> str:
    """A small data set of `owner`'s, as an upload stores it."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (96, 1, 28, 28), dtype=np.uint8)
    y = np.arange(96, dtype=np.int64) % 10
    ds = canonical(x[32:], y[32:], x[:32], y[:32])
    ds_id = str(uuid.uuid4())
    db = Database(svc.database_url)
    with db.writer() as s:
        create_dataset(s, dataset_id=ds_id, owner=owner, name="bob-secret", parsed=ds)
    db.dispose()
    return ds_id


def test_a_queue_made_job_may_not_use_another_owners_data_set(svc: Service, r: Redis) -> None:
    bobs, missing = stored_dataset(svc, owner_id(svc.keys[1])), str(uuid.uuid4())
    alice = svc.client(svc.keys[0])
    errors = []
    for ds in (bobs, missing):
        entry = str(uuid.uuid4())
        kwargs = {"spec": {**SPEC, "dataset": f"ds:{ds}"}, "owner": owner_id(svc.keys[0])}
        rq_queue(svc, r).enqueue_call(TASK, kwargs=kwargs, job_id=entry)
        run_to_its_end(r, entry)
        job = alice.job(entry)
        assert job["status"] == "failed" and job["error"]["code"] == "invalid_spec", job
        assert f"ds:{ds}" in job["error"]["message"]
        errors.append(job["error"]["message"].replace(ds, "<id>"))
    assert errors[0] == errors[1]  # Bob's set is told apart from no set at all by nothing

"""The queue is an API: a worker runs only `worker.tasks.train`, with the payload that the
contract in core.queue names. Any other entry is failed in RQ with the reason, nothing of it
runs, and the worker goes on to the next one. Secrets and host names stay off the wire."""

from __future__ import annotations

import os
import signal
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from redis import Redis
from rq import Callback, Queue, Retry
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer
from rq.webhook import Webhook

from api.auth import owner_id
from client.http import ApiError
from core.datasets import canonical
from core.db import Database
from core.queue import RESULT_TTL_S
from core.spec import JobSpec
from core.store import create_dataset, create_job
from tests.memory import peak_growth_mib
from tests.service import RedisServer, Service, children, descendants, wait_until

pytestmark = pytest.mark.slow  # real workers and services: the full run, not --fast

TASK = "worker.tasks.train"
SPEC = {"epochs": 1, "max_steps": 3}
ENDED = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)


@pytest.fixture(scope="module")
def svc(
    service_data_dir: Path, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("db") / "trainq.db"
    service = Service(data_dir=service_data_dir, database_url=f"sqlite:///{db}", redis=redis_server)
    yield service.up(workers=1)
    service.stop()


@pytest.fixture
def r(svc: Service) -> Iterator[Redis]:
    client = svc.redis.client()
    yield client
    client.close()


def rq_queue(svc: Service, r: Redis) -> Queue:
    return Queue(svc.queue, connection=r, serializer=JSONSerializer)


def ended(r: Redis, entry: str) -> Job:
    job = Job.fetch(entry, connection=r, serializer=JSONSerializer)
    wait_until(lambda: job.get_status() in ENDED, 30, f"queue entry {entry} to end", 0.1)
    return job


def assert_refused(
    svc: Service, r: Redis, entry: str, reason: str, job_id: str | None = None
) -> None:
    job = ended(r, entry)
    assert job.get_status() == JobStatus.FAILED
    assert entry in FailedJobRegistry(svc.queue, connection=r, serializer=JSONSerializer)
    result = job.latest_result()
    assert result is not None and result.exc_string is not None
    assert result.exc_string.startswith("refused by trainq: ") and reason in result.exc_string
    # Nothing of it ran: no trainq job was made for it.
    with pytest.raises(ApiError) as e:
        svc.client(svc.admin_key).job(job_id or entry)
    assert e.value.status == 404


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


# What a producer with write access to Redis can put there that RQ itself cannot read. Each
# entry is dropped (its hash deleted, a log line naming it) and the worker goes on.
def rq_worker_pid(svc: Service) -> int:
    """The RQ worker process under the launcher (which restarts one that dies)."""
    (pid,) = children(svc.workers[0].pid)
    return pid


def push_entry(
    svc: Service, r: Redis, entry: str | bytes, fields: dict[bytes, bytes | None] | None = None
) -> bytes:
    """An entry of the contract's shape as RQ writes it, `fields` overwritten (None: left
    out), pushed on the queue straight through Redis. Its hash's key."""
    job = Job.create(TASK, kwargs={"spec": SPEC}, connection=r, serializer=JSONSerializer)
    mapping: dict[bytes, bytes | None] = {
        k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in job.to_dict().items()
    }
    mapping |= {b"status": b"queued", b"origin": svc.queue.encode(), **(fields or {})}
    raw_id = entry if isinstance(entry, bytes) else entry.encode()
    key = Job.redis_job_namespace_prefix.encode() + raw_id
    r.hset(key, mapping={k: v for k, v in mapping.items() if v is not None})  # type: ignore[arg-type]
    r.rpush(rq_queue(svc, r).key, raw_id)
    return key


def run_one(svc: Service) -> None:
    c = svc.client()
    job_id = str(c.submit(SPEC)["id"])
    wait_until(lambda: c.job(job_id)["status"] == "succeeded", 60, "a good job", interval=0.2)


UNREADABLE: dict[str, dict[bytes, bytes | None]] = {
    "junk created_at": {b"created_at": b"garbage"},
    "junk status": {b"status": b"junk"},
    "no data": {b"data": None},
    "a value that is not UTF-8": {b"origin": b"\xff\xfe"},
    "a field name that is not UTF-8": {b"\xff": b"x"},
    "junk dependency_ids": {b"dependency_ids": b"not json"},
    "too many fields": {f"f{i}".encode(): b"1" for i in range(100)},
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_an_entry_rq_cannot_restore_is_dropped_and_the_worker_goes_on(
    svc: Service, r: Redis, case: str
) -> None:
    worker = rq_worker_pid(svc)
    entry = str(uuid.uuid4())
    key = push_entry(svc, r, entry, UNREADABLE[case])
    run_one(svc)
    assert rq_worker_pid(svc) == worker
    assert not r.exists(key)
    assert entry.encode() not in r.lrange(rq_queue(svc, r).key, 0, -1)


def test_an_entry_whose_key_is_no_hash_is_dropped(svc: Service, r: Redis) -> None:
    worker = rq_worker_pid(svc)
    entry = str(uuid.uuid4())
    r.set(f"rq:job:{entry}", "not a hash")
    r.rpush(rq_queue(svc, r).key, entry)
    run_one(svc)
    assert rq_worker_pid(svc) == worker
    assert not r.exists(f"rq:job:{entry}")


@pytest.mark.parametrize("entry", [b"not an id!", b"\xff\xfe-not-utf-8"])
def test_an_id_rq_cannot_name_a_job_by_is_dropped(svc: Service, r: Redis, entry: bytes) -> None:
    worker = rq_worker_pid(svc)
    key = push_entry(svc, r, entry)
    run_one(svc)
    assert rq_worker_pid(svc) == worker
    assert not r.exists(key)
    queue = rq_queue(svc, r)
    assert entry not in r.lrange(queue.key, 0, -1) + r.lrange(queue.intermediate_queue_key, 0, -1)


def test_a_huge_field_never_reaches_the_worker(svc: Service, r: Redis) -> None:
    """A 64 MiB description: the bounds are checked inside Redis, before any of it is read."""
    entry = str(uuid.uuid4())

    def dropped() -> None:
        key = push_entry(svc, r, entry, {b"description": b"x" * (64 << 20)})
        wait_until(lambda: not r.exists(key), 30, "the entry to be dropped", 0.1)

    _, growth = peak_growth_mib(rq_worker_pid(svc), dropped)
    assert growth < 16, f"the worker grew by {growth} MiB"
    run_one(svc)


def test_a_zlib_bomb_is_refused_before_it_inflates(svc: Service, r: Redis) -> None:
    """48 MiB of JSON in 47 KiB of zlib: the worker inflates no more than the 32 KiB it
    reads, and fails the entry with that reason."""
    entry = str(uuid.uuid4())
    bomb = zlib.compress(b"[" + b" " * (48 << 20), 9)

    _, growth = peak_growth_mib(
        rq_worker_pid(svc), lambda: (push_entry(svc, r, entry, {b"data": bomb}), ended(r, entry))
    )
    assert growth < 16, f"the worker grew by {growth} MiB"
    assert_refused(svc, r, entry, "the payload is over 32768 bytes")


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


def test_junk_in_rqs_own_lists_never_stops_a_worker(svc: Service, r: Redis) -> None:
    """Ids that RQ cannot decode, written into its started registry and intermediate list:
    RQ's registry maintenance, which a worker runs as it starts, must not quit on them (the
    launcher would restart it into the same junk, for ever)."""
    queue = rq_queue(svc, r)
    r.zadd(queue.started_job_registry.key, {b"\xff\xfe:1": 1})  # expired long ago
    r.rpush(queue.intermediate_queue_key, b"\xff\xfe-junk")
    r.delete(queue.registry_cleaning_key)  # the next worker to start runs the maintenance
    old = rq_worker_pid(svc)
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: children(svc.workers[0].pid) not in ([], [old]), 30, "a new worker")
    fresh = rq_worker_pid(svc)
    wait_until(lambda: not r.exists(queue.registry_cleaning_key), 30, "the maintenance to run")
    run_one(svc)
    assert rq_worker_pid(svc) == fresh
    assert "RQ names no job by it" in svc.logs()


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
        create_dataset(
            s,
            dataset_id=ds_id,
            owner=owner,
            name="bob-secret",
            npz=ds.npz,
            sha256=ds.sha256,
            image_shape=ds.image_shape,
            num_classes=ds.num_classes,
            train_count=ds.train_count,
            test_count=ds.test_count,
        )
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


# RQ's command channel (rq:pubsub:<worker>) takes a message from anyone who can write to
# Redis: a worker hears only trainq's own stop-job, and nothing sent there stops it hearing.
JUNK_COMMANDS = [b"\xff not json", b"[]", b'{"command": 1}', b"{" * 2000]
RQ_COMMANDS = [b'{"command": "kill-horse"}', b'{"command": "shutdown"}']


def worker_name(svc: Service, r: Redis) -> str:
    """The running RQ worker's name (a killed one's registration may linger a while)."""
    pid = str(rq_worker_pid(svc)).encode()
    keys = r.smembers(f"rq:workers:{svc.queue}")
    (key,) = [k for k in keys if r.hget(k, "pid") == pid]
    return (key.decode() if isinstance(key, bytes) else key).removeprefix("rq:worker:")


@pytest.mark.parametrize("messages", [JUNK_COMMANDS, RQ_COMMANDS], ids=["junk", "rq's own"])
def test_the_command_channel_hears_only_trainqs_stop(
    svc: Service, r: Redis, messages: list[bytes]
) -> None:
    from core.queue import stop_entry

    worker, channel, c = rq_worker_pid(svc), f"rq:pubsub:{worker_name(svc, r)}", svc.client()
    job_id = str(c.submit({**SPEC, "epochs": 50, "max_steps": None, "max_restarts": 0})["id"])
    wait_until(lambda: c.job(job_id)["status"] == "running", 60, "the job to run", 0.1)
    for message in messages:
        assert r.publish(channel, message) == 1
    assert stop_entry(r, job_id)  # heard after them, on the same channel
    job = ended(r, job_id)
    assert job.get_status() == JobStatus.STOPPED  # not killed, as kill-horse would
    assert rq_worker_pid(svc) == worker  # not shut down
    assert r.pubsub_numsub(channel)[0][1] == 1


HEALTH_FRESH_S = 1.0  # how long an API process keeps its last probe (HealthCache)


def test_a_worker_registration_rq_cannot_read_costs_no_health_or_metrics(
    svc: Service, r: Redis
) -> None:
    """Anyone who can write to Redis can register a fake worker with a junk date: /health
    still answers 200 with the real worker, and /metrics counts only it."""
    real, fake = worker_name(svc, r), f"rq:worker:fake-{uuid.uuid4().hex[:8]}"
    r.sadd(f"rq:workers:{svc.queue}", fake)
    r.sadd("rq:workers", fake)
    r.hset(fake, mapping={"birth": "junk", "last_heartbeat": "junk", "queues": svc.queue})
    try:
        admin = svc.client(svc.admin_key).http
        time.sleep(HEALTH_FRESH_S + 0.5)  # past any probe made before the registration
        health = admin.get("/health")
        assert health.status_code == 200, health.text
        assert health.json()["redis"] is True
        # Real workers only (one killed by an earlier test may still be registered).
        names = [w["name"] for w in health.json()["workers"]]
        assert real in names and fake.removeprefix("rq:worker:") not in names
        metrics = admin.get("/metrics")
        assert metrics.status_code == 200, metrics.text
        assert f"trainq_workers_alive {float(len(names))}" in metrics.text.splitlines()
    finally:
        r.srem(f"rq:workers:{svc.queue}", fake)
        r.srem("rq:workers", fake)
        r.delete(fake)

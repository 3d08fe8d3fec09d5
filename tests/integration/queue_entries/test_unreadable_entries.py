"""What a producer with write access to Redis can put there that RQ itself cannot read:
entries, ids, fields past any bound, junk in RQ's own lists, commands and worker
registrations. Each is dropped (an entry's hash deleted, a log line naming it) or ignored,
and the worker goes on."""

from __future__ import annotations

import os
import signal
import time
import uuid
import zlib

import httpx
import pytest
from redis import Redis
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from tests.faults.process_tree import rq_workers
from tests.integration.queue_entries.entries import SPEC, TASK, assert_refused, ended, rq_queue
from tests.memory import peak_growth_mib
from tests.service import Service, wait_until

pytestmark = pytest.mark.slow  # real workers and services: the full run, not --fast


def rq_worker_pid(svc: Service) -> int:
    """The RQ worker process under the launcher (which restarts one that dies)."""
    (pid,) = rq_workers(svc.workers[0].pid)
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
    # Whose entry goes first is fair share's choice (this one competes as an admin's job),
    # so it may be taken after the good job has run.
    wait_until(lambda: not r.exists(key), 30, "the entry to be dropped", 0.1)
    assert rq_worker_pid(svc) == worker
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


def test_junk_in_rqs_own_lists_never_stops_a_worker(svc: Service, r: Redis) -> None:
    """Ids that RQ cannot decode, written into its started registry and intermediate list,
    and a registry key of another type: RQ's registry maintenance, which a worker runs as it
    starts, must not quit on them (the worker would start again into the same junk, for
    ever, taking no job)."""
    queue = rq_queue(svc, r)
    r.zadd(queue.started_job_registry.key, {b"\xff\xfe:1": 1})  # expired long ago
    r.rpush(queue.intermediate_queue_key, b"\xff\xfe-junk")
    r.set(queue.canceled_job_registry.key, "junk")  # WRONGTYPE for RQ's every command on it
    r.set("rq:workers", "junk")  # RQ's set of all workers, which a worker joins as it starts
    r.delete(queue.registry_cleaning_key)  # the next worker to start runs the maintenance
    old = rq_worker_pid(svc)
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: rq_workers(svc.workers[0].pid) not in ([], [old]), 30, "a new worker")
    fresh = rq_worker_pid(svc)
    wait_until(lambda: not r.exists(queue.registry_cleaning_key), 30, "the maintenance to run")
    run_one(svc)
    assert rq_worker_pid(svc) == fresh
    logs = svc.logs(tail=None)
    assert "RQ names no job by it" in logs
    assert f"deleted {queue.canceled_job_registry.key}" in logs
    assert "deleted rq:workers: a " in logs
    assert "the worker loop ended" not in logs  # the same RQ worker took the job


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
    from worker.entry_checks import stop_entry

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


@pytest.mark.parametrize("junk", ["date", "name", "type"])
def test_a_worker_registration_rq_cannot_read_costs_no_health_or_metrics(
    svc: Service, r: Redis, junk: str
) -> None:
    """Anyone who can write to Redis can register a fake worker with a junk date, a name
    that is not UTF-8, or a key that is no hash: /health still answers 200 with the real
    worker and Redis up, and /metrics counts only it."""
    real = worker_name(svc, r)
    fake: str | bytes = f"rq:worker:fake-{uuid.uuid4().hex[:8]}"
    if junk == "name":
        fake = f"{fake}-".encode() + b"\xff\xfe"
    r.sadd(f"rq:workers:{svc.queue}", fake)
    r.sadd("rq:workers", fake)
    if junk == "type":
        r.set(fake, "junk")
    else:
        r.hset(fake, mapping={"birth": "junk", "last_heartbeat": "junk", "queues": svc.queue})
    try:
        admin = svc.client(svc.admin_key).http
        time.sleep(HEALTH_FRESH_S + 0.5)  # past any probe made before the registration
        health = admin.get("/health")
        assert health.status_code == 200, health.text
        assert health.json()["redis"] is True
        # Real workers only (one killed by an earlier test may still be registered).
        names = [w["name"] for w in health.json()["workers"]]
        shown = fake if isinstance(fake, str) else fake.decode(errors="replace")
        assert real in names and shown.removeprefix("rq:worker:") not in names
        assert httpx.get(f"{svc.url}/health").status_code == 200  # without a key, too
        metrics = admin.get("/metrics")
        assert metrics.status_code == 200, metrics.text
        assert f"trainq_workers_alive {float(len(names))}" in metrics.text.splitlines()
    finally:
        r.srem(f"rq:workers:{svc.queue}", fake)
        r.srem("rq:workers", fake)
        r.delete(fake)


def test_a_queue_key_of_another_type_is_no_redis_outage_and_goes(svc: Service, r: Redis) -> None:
    """The queue's own key made a string: /health answers 200 with Redis up (the depth
    unknown), and the worker, whose wait for a job fails on it, deletes it as it starts
    again and takes the next job."""
    queue, worker = rq_queue(svc, r), rq_worker_pid(svc)
    os.kill(worker, signal.SIGSTOP)  # the key stays as it is while /health reads it
    try:
        r.set(queue.key, "junk")
        time.sleep(HEALTH_FRESH_S + 0.5)  # past any probe made before
        health = svc.client(svc.admin_key).http.get("/health")
    finally:
        os.kill(worker, signal.SIGCONT)
    assert health.status_code == 200, health.text
    assert (health.json()["redis"], health.json()["queue_depth"]) == (True, None)
    wait_until(lambda: r.type(queue.key) != b"string", 60, "the worker to delete the key", 0.2)
    run_one(svc)


def test_a_worker_set_grown_by_the_thousand_costs_a_probe_a_bounded_read(
    svc: Service, r: Redis
) -> None:
    """Registrations that name no worker, by the thousand, in the queue's set of workers:
    /health reads at most REGISTRATIONS_READ_MAX of them a probe and drops what it read,
    and still counts the real worker."""
    from api.routes.health import REGISTRATIONS_READ_MAX

    listed = f"rq:workers:{svc.queue}"
    junk = [f"rq:worker:junk-{i}" for i in range(3 * REGISTRATIONS_READ_MAX)]
    r.sadd(listed, *junk)
    try:
        before = r.scard(listed)
        time.sleep(HEALTH_FRESH_S + 0.5)
        health = httpx.get(f"{svc.url}/health")
        assert health.status_code == 200, health.text
        assert before - REGISTRATIONS_READ_MAX <= r.scard(listed) < before

        def drained() -> bool:
            assert httpx.get(f"{svc.url}/health").status_code == 200
            return not any(m.startswith(b"rq:worker:junk-") for m in r.smembers(listed))

        wait_until(drained, 30, "the probes to drop the junk", HEALTH_FRESH_S)
        names = [w["name"] for w in svc.client(svc.admin_key).health()["workers"]]
        assert worker_name(svc, r) in names
    finally:
        r.srem(listed, *junk)

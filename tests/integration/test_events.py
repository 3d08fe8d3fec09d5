"""Every follower's event stream closes when its job ends, whoever ended it, and never
skips a step it could still get: real API, workers, reconciler and redis-server, with the
fault suite's shortened timings (tests/recovery.py)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from client.http import Client
from core.db import Database
from core.spec import JobStatus
from core.store import claim_job, end_job
from core.stream import EntryId, publish_steps, stream_key
from core.train import StepMetrics
from tests.recovery import FAST_RECOVERY, SPEC, STEPS
from tests.service import RedisServer, Service, kill_group, wait_until
from tests.wire import WireProxy

FOLLOW_BOUND_S = 240.0  # the whole follow, however slow the machine
CLOSE_BOUND_S = 20.0  # from the job's end in the database to the follower's last event
ENDED_TTL_S = 24 * 3600


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, service_data_dir: Path) -> Iterator[Service]:
    """One API over SQLite; each test starts (and stops) the workers it needs."""
    root = tmp_path_factory.mktemp("events")
    redis = RedisServer(root / "redis")
    redis.start()
    service = Service(
        data_dir=service_data_dir,
        database_url=f"sqlite:///{root / 'trainq.db'}",
        redis=redis,
        extra_env=FAST_RECOVERY,
        log_dir=root,
    )
    service.migrate()
    service.start_api()
    yield service
    service.stop()
    redis.kill()


@pytest.fixture
def pool(svc: Service) -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(4)
    yield executor
    svc.stop_workers()
    executor.shutdown(wait=False, cancel_futures=True)


def follow(svc: Service, job_id: str, last_event_id: str | None = None) -> list[dict[str, Any]]:
    """Every event until the server closes the stream; fails if it is still open after
    FOLLOW_BOUND_S (keep-alives do not count)."""
    headers = {"Authorization": f"Bearer {svc.keys[0]}"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    deadline = time.monotonic() + FOLLOW_BOUND_S
    events: list[dict[str, Any]] = []
    event: dict[str, str] = {}
    url = f"{svc.url}/jobs/{job_id}/events"
    with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(30)) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if time.monotonic() > deadline:
                raise AssertionError(f"the stream of job {job_id} is still open: {events[-3:]}")
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(":")
                event[name] = value.removeprefix(" ")
            elif event:
                events.append({**event, "data": json.loads(event["data"])})
                event = {}
    return events


def assert_every_step_once(events: list[dict[str, Any]], last: int) -> None:
    """Steps 1..last in order, each once, except ranges named by a gap event."""
    want = 1
    for e in events:
        if e["event"] == "step":
            assert e["data"]["step"] == want, (e["id"], want)
            want += 1
        elif e["event"] == "gap":
            assert e["data"]["from"] == want and e["data"]["to"] >= want, (e, want)
            want = e["data"]["to"] + 1
    assert want == last + 1, (want, last)


def kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["event"] == kind]


def last_status(events: list[dict[str, Any]]) -> str:
    assert events and events[-1]["event"] == "status", events[-3:]
    return str(events[-1]["data"]["status"])


def end_step(events: list[dict[str, Any]]) -> int:
    return EntryId.parse(events[-1]["id"]).step


def job_now(c: Client, job_id: str) -> dict[str, Any]:
    return c.job(job_id)


def wait_step(c: Client, job_id: str, step: int) -> None:
    wait_until(lambda: job_now(c, job_id)["progress"]["step"] >= step, 120, f"step {step}", 0.1)


def wait_status(c: Client, job_id: str, status: str) -> None:
    wait_until(lambda: job_now(c, job_id)["status"] == status, 120, f"job {status}", 0.2)


def assert_keys_expire(r: Redis, job_id: str) -> None:
    keys = r.keys(f"trainq:job:{job_id}:*")
    assert keys
    for key in keys:
        assert 0 < r.ttl(key) <= ENDED_TTL_S, key


@pytest.mark.slow  # trains past an epoch, then waits out a lost worker
def test_a_job_ended_by_the_reconciler_closes_its_followers(
    svc: Service, pool: ThreadPoolExecutor, worker: subprocess.Popen[bytes]
) -> None:
    c = svc.client()
    job = c.submit(SPEC | {"max_restarts": 0, "epochs": 20})["id"]
    live = pool.submit(follow, svc, job)
    wait_step(c, job, 32 + 10)  # after epoch 1's checkpoint: later steps only in Redis
    kill_group(worker)
    svc.start_worker()  # its launcher reconciles
    wait_status(c, job, "failed")
    events = live.result(timeout=CLOSE_BOUND_S)
    assert last_status(events) == "failed"
    assert events[-1]["data"]["error"]["code"] == "worker_lost"
    assert_every_step_once(events, end_step(events))
    assert not kinds(events, "gap")
    r = svc.redis.client()
    assert_keys_expire(r, job)

    # Redis loses the steps that only it had: a new follower is told they are gone.
    r.xtrim(stream_key(job), maxlen=3, approximate=False)
    again = pool.submit(follow, svc, job).result(timeout=CLOSE_BOUND_S)
    assert last_status(again) == "failed"
    assert_every_step_once(again, end_step(events))
    [gap] = kinds(again, "gap")
    assert gap["from"] == 33 and gap["to"] == end_step(events) - 2
    assert [e["epoch"] for e in kinds(again, "epoch")] == [1]


@pytest.mark.slow  # trains past an epoch, then waits out a lost worker
def test_cancel_of_a_requeued_job_answers_202_and_closes_its_followers(
    svc: Service, pool: ThreadPoolExecutor, worker: subprocess.Popen[bytes]
) -> None:
    c = svc.client()
    job = c.submit(SPEC | {"epochs": 20})["id"]
    live = pool.submit(follow, svc, job)
    wait_step(c, job, 32 + 10)
    # No worker runs after the kill, so nothing can claim the job between its requeue (the
    # API's reconciler) and the cancel: a worker started meanwhile could take it first.
    kill_group(worker)
    wait_until(lambda: job_now(c, job)["status"] == "queued", 60, "the job to be requeued")
    resp = httpx.post(
        f"{svc.url}/jobs/{job}/cancel", headers={"Authorization": f"Bearer {svc.keys[0]}"}
    )
    assert resp.status_code == 202, resp.text
    assert resp.json()["status"] == "canceled"
    events = live.result(timeout=CLOSE_BOUND_S)
    assert last_status(events) == "canceled"
    assert_every_step_once(events, end_step(events))
    assert_keys_expire(svc.redis.client(), job)


@pytest.mark.slow  # three epochs, followed
@pytest.mark.usefixtures("worker")
def test_followers_across_a_stream_that_lost_entries_see_every_step_once(
    svc: Service, pool: ThreadPoolExecutor
) -> None:
    c = svc.client()
    job = c.submit(SPEC)["id"]
    r = svc.redis.client()
    followers: list[Future[list[dict[str, Any]]]] = [pool.submit(follow, svc, job)]
    wait_step(c, job, 10)
    r.delete(stream_key(job))  # mid epoch 1: its steps so far are nowhere but in memory
    wait_step(c, job, 14)
    followers.append(pool.submit(follow, svc, job))  # joins with steps 1..10 gone from Redis
    wait_step(c, job, 32 + 14)
    r.xtrim(stream_key(job), maxlen=5, approximate=False)  # mid epoch 2
    followers.append(pool.submit(follow, svc, job))
    wait_status(c, job, "succeeded")
    for f in followers:
        events = f.result(timeout=CLOSE_BOUND_S)
        assert last_status(events) == "succeeded"
        assert_every_step_once(events, STEPS)
        assert not kinds(events, "gap")  # the database had every one
        assert [e["epoch"] for e in kinds(events, "epoch")] == [1, 2, 3]


@pytest.fixture
def proxied(svc: Service) -> Iterator[tuple[Service, WireProxy]]:
    """Workers that reach Redis through a WireProxy (the API reaches it directly)."""
    proxy = WireProxy(svc.redis.port).start()
    via = Service(
        data_dir=svc.data_dir,
        database_url=svc.database_url,
        redis=svc.redis,
        queue=svc.queue,
        port=svc.port,
        extra_env=FAST_RECOVERY | {"TRAINQ_REDIS_URL": proxy.url},
        log_dir=svc.log_dir,
    )
    yield via, proxy
    via.stop_workers()
    proxy.close()


@pytest.mark.slow  # three epochs, followed
def test_epoch_events_survive_a_lost_reply_and_an_outage_at_an_epochs_end(
    svc: Service, proxied: tuple[Service, WireProxy], pool: ThreadPoolExecutor
) -> None:
    via, proxy = proxied
    c = svc.client()
    via.start_worker()
    svc.wait_for_workers(1)
    job = c.submit(SPEC)["id"]
    live = pool.submit(follow, svc, job)
    wait_step(c, job, 3)
    proxy.drop_reply(b":events")  # a block of steps lands, its reply is lost
    wait_until(lambda: proxy.dropped == 1, 60, "a reply to be dropped")
    wait_step(c, job, 24)
    port = proxy.port
    proxy.close()  # Redis away (refused) across the end of epoch 1
    try:
        wait_until(lambda: job_now(c, job)["progress"]["epoch"] >= 1, 60, "epoch 1 to end")
    finally:
        back = WireProxy(svc.redis.port, port=port).start()
    try:
        wait_status(c, job, "succeeded")
        events = live.result(timeout=CLOSE_BOUND_S)
    finally:
        back.close()
    assert last_status(events) == "succeeded"
    assert_every_step_once(events, STEPS)
    assert [e["epoch"] for e in kinds(events, "epoch")] == [1, 2, 3]


def test_a_refused_redis_command_is_503_and_leaves_no_job(svc: Service) -> None:
    c = svc.client()
    before = len(list(c.jobs()))
    r = svc.redis.client()
    r.config_set("maxmemory", "1")  # every write is refused: OOM, not a lost connection
    try:
        resp = httpx.post(
            f"{svc.url}/jobs",
            json={"epochs": 1, "max_steps": 2},
            headers={"Authorization": f"Bearer {svc.keys[0]}"},
        )
    finally:
        r.config_set("maxmemory", "0")
    assert resp.status_code == 503, resp.text
    assert resp.headers["retry-after"]
    assert len(list(c.jobs())) == before


def lost_in_the_database(svc: Service, c: Client) -> str:
    """A job an attempt claimed, ended `failed` (worker_lost) in the database alone: its end
    never reached Redis."""
    job = c.submit(SPEC)["id"]  # no worker: it stays on the queue
    db = Database(svc.database_url)
    try:
        with db.writer() as s:
            claim_job(s, job_id=job, worker="w-gone", device="cpu")
        with db.writer() as s:
            end_job(s, job_id=job, status=JobStatus.failed, code="worker_lost", message="lost")
    finally:
        db.dispose()
    return job


@pytest.mark.slow
def test_a_stream_still_written_after_its_job_ended_closes_with_the_databases_status(
    svc: Service, pool: ThreadPoolExecutor
) -> None:
    """The job ended in the database, its end never reached Redis, and something (a
    superseded attempt) keeps adding steps: followers close all the same."""
    c = svc.client()
    job = lost_in_the_database(svc, c)
    r = svc.redis.client()

    def step(n: int) -> None:
        publish_steps(r, job, [StepMetrics(n, 1, 0.5, 1e-3, 100.0, 0, 0, 0, 0.0)], 1000, attempt=1)

    for n in range(1, 4):
        step(n)
    stop = threading.Event()

    def keep_writing() -> None:
        n = 4
        while not stop.wait(0.2):
            step(n)
            n += 1

    writer = threading.Thread(target=keep_writing, daemon=True)
    writer.start()
    try:
        events = pool.submit(follow, svc, job).result(timeout=CLOSE_BOUND_S)
    finally:
        stop.set()
        writer.join()
    assert last_status(events) == "failed"
    assert events[-1]["data"]["error"]["code"] == "worker_lost"
    assert_every_step_once(events, len(kinds(events, "step")))
    assert len(kinds(events, "step")) >= 3


@pytest.mark.slow
def test_an_entry_no_writer_of_ours_makes_is_skipped_by_followers(
    svc: Service, pool: ThreadPoolExecutor
) -> None:
    """Anyone who can write to Redis may add an entry of a kind trainq never writes, even
    as the stream's newest: followers skip it and still get every step and the end."""
    c = svc.client()
    job = lost_in_the_database(svc, c)
    r = svc.redis.client()
    points = [StepMetrics(n, 1, 0.5, 1e-3, 100.0, 0, 0, 0, 0.0) for n in (1, 2, 3)]
    publish_steps(r, job, points, 1000, attempt=1)
    r.xadd(stream_key(job), {"data": "{}"}, id="4-7")
    events = pool.submit(follow, svc, job).result(timeout=CLOSE_BOUND_S)
    assert last_status(events) == "failed"
    assert [p["step"] for p in kinds(events, "step")] == [1, 2, 3]
    assert c.metrics(job)["items"][-1]["step"] == 3

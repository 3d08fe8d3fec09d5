"""Faults around the API: Redis away under /health, a lost reply of the submission's queue
transaction (a wire proxy between the API and Redis), and every worker gone. Real processes
on loopback, each case bounded in time; timings shortened as in test_faults."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from rq import Queue
from rq.serializers import JSONSerializer
from sqlalchemy import func, select

from client.http import ApiError, Client
from core.db import Database, Job
from tests.service import RedisServer, Service, kill_group, postgres_database, wait_until
from tests.wire import WireProxy

FAST = {
    "TRAINQ_HEARTBEAT_TIMEOUT_S": "4",
    "TRAINQ_RECONCILE_INTERVAL_S": "1",
    "TRAINQ_QUEUE_GRACE_S": "2",
    "TRAINQ_COMMIT_WAIT_S": "1",
}
SPEC = {"epochs": 1, "batch_size": 128, "max_steps": 4}


def _service(root: Path, data_dir: Path, database_url: str, redis: RedisServer) -> Service:
    (root / "data").mkdir()
    os.symlink(data_dir / "mnist-sample", root / "data" / "mnist-sample")
    return Service(
        data_dir=root / "data",
        database_url=database_url,
        redis=redis,
        extra_env=dict(FAST),
        log_dir=root,
    )


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.kill()


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path, redis: RedisServer) -> Iterator[Service]:
    service = _service(tmp_path, data_dir, f"sqlite:///{tmp_path / 'trainq.db'}", redis)
    service.migrate()
    service.start_api()
    yield service
    service.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'trainq.db'}"
    else:
        yield from postgres_database()


@pytest.fixture
def wired(
    tmp_path: Path, data_dir: Path, database_url: str, redis: RedisServer
) -> Iterator[tuple[Service, WireProxy]]:
    """The API talks to Redis through a wire proxy; the workers talk to it directly."""
    proxy = WireProxy(redis.port).start()
    service = _service(tmp_path, data_dir, database_url, redis)
    service.extra_env["TRAINQ_REDIS_URL"] = proxy.url
    service.migrate()
    service.start_api()
    service.extra_env["TRAINQ_REDIS_URL"] = redis.url
    yield service, proxy
    service.stop()
    proxy.close()


def _health(svc: Service) -> httpx.Response:
    return httpx.get(f"{svc.url}/health", timeout=10)


def test_health_is_503_while_redis_is_away(svc: Service) -> None:
    assert _health(svc).status_code == 200
    svc.redis.kill()
    r = wait_until(lambda: (h := _health(svc)).status_code == 503 and h, 15, "/health to say 503")
    assert r.headers["retry-after"]
    assert r.json()["status"] == "degraded" and r.json()["redis"] is False
    svc.redis.start()
    wait_until(lambda: _health(svc).status_code == 200, 15, "/health to recover")


@pytest.mark.slow  # a service of its own: about 8 s
def test_health_is_503_while_redis_refuses_writes(svc: Service) -> None:
    """A full Redis (maxmemory, noeviction) answers every read and refuses every write: no
    job can be submitted or handed back, and a health check must fail."""
    assert _health(svc).status_code == 200
    r = svc.redis.client()
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    try:
        h = wait_until(lambda: (h := _health(svc)).status_code == 503 and h, 15, "a 503")
        assert h.headers["retry-after"]
        body = h.json()
        assert body["status"] == "degraded" and body["redis"] is False
        assert body["database"] is True
        assert "not writable" in body["redis_problem"]
        assert r.ping()  # it answers: only writes are refused
    finally:
        r.config_set("maxmemory", 0)
    h = wait_until(lambda: (h := _health(svc)).status_code == 200 and h, 15, "/health to recover")
    assert h.json()["redis"] is True and h.json()["redis_problem"] is None


def test_a_lost_reply_of_the_enqueue_means_no_job_now_or_later(
    wired: tuple[Service, WireProxy],
) -> None:
    svc, proxy = wired
    proxy.drop_reply(b"EXEC", 10)  # every try of the queue's MULTI/EXEC runs, unanswered
    r = httpx.post(f"{svc.url}/jobs", json=SPEC, headers={"Authorization": f"Bearer {svc.keys[0]}"})
    proxy.drop_reply(b"EXEC", 0)
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"]
    assert proxy.dropped >= 1
    queue = Queue(svc.queue, connection=svc.redis.client(), serializer=JSONSerializer)
    assert queue.count >= 1  # the transaction ran: its entries wait for a worker

    svc.start_worker()
    wait_until(lambda: queue.count == 0, 60, "the worker to take the entries", 0.2)
    # Past the worker's wait for the commit and the reconciler's grace, several passes over.
    time.sleep(1 + 2 + 3)
    admin = svc.client(svc.admin_key)
    assert list(admin.jobs()) == []
    db = Database(svc.database_url)
    try:
        with db.reader() as s:
            assert s.scalar(select(func.count()).select_from(Job)) == 0
    finally:
        db.dispose()
    assert "never committed" in svc.logs(tail=None)

    # The same path, answered: a job that exists and runs.
    job = svc.client().submit(SPEC)
    wait_until(lambda: admin.job(job["id"])["status"] == "succeeded", 120, "the job to run")


def test_an_idempotency_key_never_answers_with_a_job_that_goes_away(
    wired: tuple[Service, WireProxy],
) -> None:
    """Two API processes, one Idempotency-Key: while the first one's submission is failing
    (its enqueue slow, then unanswered), the second must not answer with the first's job."""
    svc, proxy = wired
    other = Service(
        data_dir=svc.data_dir,
        database_url=svc.database_url,
        redis=svc.redis,
        queue=svc.queue,
        extra_env=dict(FAST),
        log_dir=svc.log_dir,
    )
    other.start_api()
    try:
        headers = {"Authorization": f"Bearer {svc.keys[0]}", "Idempotency-Key": "k-1"}
        first: list[httpx.Response] = []
        # Each round trip 0.8 s: well inside the API's 2 s Redis timeout, so that only the
        # dropped EXEC replies fail, however busy the machine.
        proxy.delay(0.4)
        proxy.drop_reply(b"EXEC", 10)
        failing = threading.Thread(
            target=lambda: first.append(
                httpx.post(f"{svc.url}/jobs", json=SPEC, headers=headers, timeout=60)
            )
        )
        failing.start()
        # The first try's reply is lost; the retry keeps the submission open a while longer.
        wait_until(lambda: proxy.dropped >= 1, 30, "the first reply to be lost")
        second = httpx.post(f"{other.url}/jobs", json=SPEC, headers=headers, timeout=60)
        failing.join()
        proxy.delay(0)
        proxy.drop_reply(b"EXEC", 0)
        assert first[0].status_code == 503, first[0].text
        assert second.status_code in (200, 201), second.text
        svc.start_worker()
        admin = other.client(svc.admin_key)
        job_id = second.json()["id"]
        wait_until(lambda: admin.job(job_id)["status"] == "succeeded", 120, "the job to run")
        assert [j["id"] for j in admin.jobs()] == [job_id]
    finally:
        other.stop()


def test_the_api_reconciles_when_no_worker_is_left(svc: Service) -> None:
    c: Client = svc.client()
    worker = svc.start_worker()
    svc.wait_for_workers(1)
    job = c.submit({"epochs": 20, "batch_size": 128, "max_restarts": 0})

    def trained() -> bool:
        try:
            return int(c.job(job["id"])["progress"]["step"]) >= 5
        except ApiError:
            return False

    wait_until(trained, 120, "the job to train", 0.1)
    kill_group(worker)  # launcher, RQ worker and work horse: no reconciler but the API's
    wait_until(
        lambda: c.job(job["id"])["status"] == "failed", 60, "the API's reconciler to end it", 0.2
    )
    assert c.job(job["id"])["error"]["code"] == "worker_lost"


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_database()


@pytest.fixture
def pg_wired(
    tmp_path: Path, data_dir: Path, pg_url: str, redis: RedisServer
) -> Iterator[tuple[Service, WireProxy]]:
    """The API talks to PostgreSQL through a wire proxy; migrations and workers directly.
    The API's own reconciler stays out of the way: only the submission commits."""
    where = urlsplit(pg_url)
    proxy = WireProxy(where.port or 5432).start()
    service = _service(tmp_path, data_dir, pg_url, redis)
    service.migrate()
    service.database_url = pg_url.replace(where.netloc, f"{where.username}@127.0.0.1:{proxy.port}")
    service.extra_env["TRAINQ_RECONCILE_INTERVAL_S"] = "3600"
    service.start_api()
    service.database_url = pg_url
    service.extra_env["TRAINQ_RECONCILE_INTERVAL_S"] = FAST["TRAINQ_RECONCILE_INTERVAL_S"]
    yield service, proxy
    service.stop()
    proxy.close()


COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"  # psycopg's COMMIT, a simple query message


def test_a_lost_reply_of_the_commit_answers_with_the_job_that_was_made(
    pg_wired: tuple[Service, WireProxy],
) -> None:
    svc, proxy = pg_wired
    proxy.drop_reply(COMMIT, 1)  # the commit runs on the server; its reply never comes
    r = httpx.post(
        f"{svc.url}/jobs", json=SPEC, headers={"Authorization": f"Bearer {svc.keys[0]}"}, timeout=60
    )
    assert proxy.dropped == 1
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    svc.start_worker()
    admin = svc.client(svc.admin_key)
    wait_until(lambda: admin.job(job_id)["status"] == "succeeded", 120, "the job to run")
    assert [j["id"] for j in admin.jobs()] == [job_id]
    assert admin.job(job_id)["attempt"] == 1

"""Webhooks through crashes and outages: the dispatcher killed (kill -9) mid-delivery leaves
it to the next, which delivers the same event under the same webhook-id once the lease ends;
a database connection lost in the very transaction that ends a job (after its outbox row was
written) rolls both back, and the worker's retry writes both again: delivered once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from client.webhooks import Webhooks
from tests.integration.conftest import database
from tests.service import (
    RedisServer,
    Service,
    fresh_service,
    kill_group,
    postgres_database,
    wait_until,
)
from tests.webhook_receiver import Receiver, verify
from tests.wire import WireProxy

pytestmark = pytest.mark.slow
ENV = {
    "TRAINQ_WEBHOOK_ALLOW_HOSTS": "127.0.0.1/32",
    "TRAINQ_WEBHOOK_TIMEOUT_S": "3",
}


@pytest.fixture(params=["sqlite", "postgres"])
def svc(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    (tmp_path / "data").mkdir()
    with database(request.param, tmp_path) as url:
        service = Service(
            data_dir=tmp_path / "data", database_url=url, redis=redis, extra_env=ENV,
            log_dir=tmp_path,
        )  # fmt: skip
        try:
            service.migrate()
            service.start_api()
            yield service
        finally:
            service.stop()
            redis.kill()


def test_a_dispatcher_killed_mid_delivery_leaves_it_to_the_next(svc: Service) -> None:
    held = threading.Event()  # the first attempt's answer waits for this

    def answer(n: int) -> tuple[int, dict[str, str], bytes]:
        if n == 0:
            held.wait(60)
        return 200, {}, b"ok"

    rx = Receiver(answer=answer).start()
    try:
        h = Webhooks(svc.client())
        hook = h.add(rx.url, ["job.failed"])
        event_id = h.test(hook["id"])["event_id"]
        rx.wait_for(1)  # the dispatcher (in `trainq serve`) is mid-delivery now
        assert svc.api is not None
        kill_group(svc.api)
        held.set()
        svc.start_api()
        first, second = rx.wait_for(2)
        h = Webhooks(svc.client())
        wait_until(lambda: next(h.deliveries(hook["id"]))["status"] == "delivered", 60, "delivered")
        [entry] = list(h.deliveries(hook["id"]))
    finally:
        held.set()
        rx.close()
    assert first.webhook_id == second.webhook_id == event_id
    verify(hook["secret"], second)
    assert entry["attempts"] == 2


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_database()


def test_a_connection_lost_as_a_job_ends_loses_no_event(
    tmp_path: Path, data_dir: Path, pg_url: str
) -> None:
    where = urlsplit(pg_url)
    proxy = WireProxy(where.port or 5432).start()
    # The outbox's INSERT runs in the transaction that ends the job; its reply is lost and the
    # connection cut: the whole transaction is gone, the job's end with it.
    proxy.drop_reply(b"INSERT INTO webhook_deliveries", 1)
    rx = Receiver().start()
    try:
        with fresh_service(tmp_path, data_dir, ENV, api=False) as svc:
            svc.database_url = pg_url.replace(
                where.netloc, f"{where.username}@127.0.0.1:{proxy.port}"
            )
            svc.migrate()
            svc.start_api()
            svc.start_worker()
            h = Webhooks(svc.client())
            hook = h.add(rx.url, ["job.succeeded"])
            job = h.client.submit({"epochs": 1, "max_steps": 3, "export": ["torchscript"]})
            wait_until(
                lambda: [d["status"] for d in h.deliveries(hook["id"])] == ["delivered"],
                240,
                "the job's event delivered",
                interval=0.2,
            )
            done = h.client.job(job["id"])
            [got] = rx.received
    finally:
        rx.close()
        proxy.close()
    assert proxy.dropped == 1
    assert (done["status"], done["attempt"]) == ("succeeded", 1)
    assert json.loads(got.body)["data"]["job_id"] == job["id"]
    verify(hook["secret"], got)


def test_webhooks_are_delivered_while_redis_is_away(svc: Service) -> None:
    """The outbox and its dispatcher live in the database: with Redis gone, an event still
    goes out."""
    rx = Receiver().start()
    try:
        h = Webhooks(svc.client())
        hook = h.add(rx.url, ["job.failed"])
        svc.redis.kill()
        event_id = h.test(hook["id"])["event_id"]
        [got] = rx.wait_for(1)
    finally:
        rx.close()
    assert got.webhook_id == event_id
    verify(hook["secret"], got)

"""The dispatcher against a real receiver on loopback: signed deliveries that Standard Webhooks
verifiers accept, retries with the same webhook-id, no redirect followed, the address checked
again at every delivery and connected to as checked, a day of failures (here a second) that
marks the endpoint failing and holds its delivery, and two dispatchers that never send one
delivery twice. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy import select, update

from core.config import Settings
from core.db import Database, WebhookDelivery, WebhookEndpoint, WebhookEvent, db_ago
from core.webhooks.addresses import Resolver, system_resolver
from core.webhooks.deliveries import purge_log
from core.webhooks.dispatcher import Dispatcher, Pace
from core.webhooks.endpoints import create_endpoint, update_endpoint
from core.webhooks.outbox import TEST_EVENT, record_event
from tests.service import wait_until
from tests.webhook_receiver import Received, Receiver, verify, verify_with_library

FAST = Pace(poll_s=0.05, connect_timeout_s=1.0, retry_base_s=0.2, lease_factor=2.5)


@contextlib.contextmanager
def dispatching(
    db: Database,
    allow: str = "127.0.0.1/32",
    resolve: Resolver = system_resolver,
    timeout_s: float = 2.0,
    **pace: Any,
) -> Iterator[Dispatcher]:
    """A dispatcher on a thread of its own until the block ends."""
    settings = Settings(webhook_allow_hosts=allow, webhook_timeout_s=timeout_s)
    dispatcher = Dispatcher(db, settings, resolve, dataclasses.replace(FAST, **pace))
    stop = threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run(stop)), daemon=True)
    thread.start()
    try:
        yield dispatcher
    finally:
        stop.set()
        thread.join(30)


@contextlib.contextmanager
def receiving(host: str = "127.0.0.1", answer: Any = None) -> Iterator[Receiver]:
    receiver = Receiver(host, answer) if answer else Receiver(host)
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.close()


def endpoint(db: Database, url: str, owner: str | None = None) -> WebhookEndpoint:
    with db.writer() as s:
        return create_endpoint(
            s, owner=owner or f"k_{uuid.uuid4().hex[:12]}", url=url, events=[], description=None
        )


def send_test(db: Database, hook: WebhookEndpoint, n: int = 1) -> list[str]:
    with db.writer() as s:
        return [
            str(
                record_event(
                    s, owner=hook.owner, type=TEST_EVENT, data={"n": i}, endpoint_id=hook.id
                )
            )
            for i in range(n)
        ]


def deliveries(db: Database, hook: WebhookEndpoint) -> Sequence[WebhookDelivery]:
    with db.reader() as s:
        q = select(WebhookDelivery).where(WebhookDelivery.endpoint_id == hook.id)
        return s.scalars(q.order_by(WebhookDelivery.id)).all()


def settled(db: Database, hook: WebhookEndpoint, status: str = "delivered") -> WebhookDelivery:
    def done() -> WebhookDelivery | None:
        [d] = deliveries(db, hook)
        return d if d.status == status else None

    return wait_until(done, 60, f"the delivery to be {status}")  # type: ignore[no-any-return]


def answers(*statuses: int) -> Any:
    def answer(n: int) -> tuple[int, dict[str, str], bytes]:
        return statuses[min(n, len(statuses) - 1)], {}, b"answered"

    return answer


def test_a_delivery_is_signed_as_standard_webhooks_verifiers_expect(db: Database) -> None:
    with receiving() as rx, dispatching(db):
        hook = endpoint(db, rx.url)
        [event_id] = send_test(db, hook)
        done = settled(db, hook)
        [got] = rx.received
    verify(hook.secret, got)
    verify_with_library(hook.secret, got)
    assert got.webhook_id == event_id
    body = json.loads(got.body)
    assert (body["type"], body["data"]) == (TEST_EVENT, {"n": 0})
    assert (done.attempts, done.last_status_code, done.last_error) == (1, 200, None)
    assert done.latency_ms is not None and done.delivered_at is not None


def test_a_failed_delivery_comes_again_with_the_same_webhook_id(db: Database) -> None:
    with receiving(answer=answers(500, 200)) as rx, dispatching(db):
        hook = endpoint(db, rx.url)
        send_test(db, hook)
        done = settled(db, hook)
        first, second = rx.received
    assert first.webhook_id == second.webhook_id
    assert first.body == second.body
    for got in (first, second):
        verify(hook.secret, got)
    assert (done.attempts, done.last_status_code) == (2, 200)


def test_an_answer_holding_nul_bytes_is_logged_and_backed_off(db: Database) -> None:
    """PostgreSQL's text holds no NUL: a receiver whose error page has one must still see its
    failure stored (and the retries back off), not the outcome dropped at every lease."""

    def answer(n: int) -> tuple[int, dict[str, str], bytes]:
        return 500, {}, b"broken\x00page"

    with receiving(answer=answer) as rx, dispatching(db):
        hook = endpoint(db, rx.url)
        send_test(db, hook)
        wait_until(lambda: deliveries(db, hook)[0].last_status_code == 500, 10, "the outcome")
        [d] = deliveries(db, hook)
        rx.close()
    assert d.last_error == "answered 500: broken\ufffdpage"


def test_a_redirect_is_a_failure_and_is_not_followed(db: Database) -> None:
    with receiving() as target:
        moved = answers(307)

        def redirect(n: int) -> tuple[int, dict[str, str], bytes]:
            return moved(n)[0], {"location": target.url}, b""

        with (
            receiving(host="127.0.0.2", answer=redirect) as rx,
            dispatching(db, allow="127.0.0.2/32"),
        ):
            hook = endpoint(db, rx.url)
            send_test(db, hook)
            wait_until(lambda: deliveries(db, hook)[0].last_status_code == 307, 60, "the 307")
        [d] = deliveries(db, hook)
        assert d.status == "pending" and "redirect" in (d.last_error or "")
        assert target.received == []


def test_each_delivery_connects_to_the_address_it_checked(db: Database) -> None:
    """The name resolves only through the dispatcher's resolver: the connection goes to the
    address checked, and the name travels in the Host header."""
    with receiving() as rx, dispatching(db, resolve=lambda host, port: ["127.0.0.1"]):
        hook = endpoint(db, f"http://hooks.invalid:{rx.port}/hook")
        send_test(db, hook)
        settled(db, hook)
        [got] = rx.received
    assert got.headers["host"] == f"hooks.invalid:{rx.port}"


def test_an_international_host_name_is_sent_in_its_ascii_form(db: Database) -> None:
    """A host name beyond ASCII goes in the Host header as IDNA (punycode) spells it: HTTP
    headers are ASCII, and an attempt that cannot be sent must not come back forever."""
    with receiving() as rx, dispatching(db, resolve=lambda host, port: ["127.0.0.1"]):
        hook = endpoint(db, f"http://bücher.invalid:{rx.port}/hook")
        send_test(db, hook)
        done = settled(db, hook)
        [got] = rx.received
    assert got.headers["host"] == f"xn--bcher-kva.invalid:{rx.port}"
    assert done.attempts == 1


def test_a_url_no_request_can_carry_is_a_failure_that_backs_off(db: Database) -> None:
    """A URL stored before its check refused what it holds (a DEL character): its attempt
    fails, stored as such and backed off, never dropped to come back at every lease (a back-off
    of seconds here, so that no second attempt comes before the first is read, however busy
    the machine)."""
    loopback: Resolver = lambda host, port: ["127.0.0.1"]  # noqa: E731
    with receiving() as rx, dispatching(db, resolve=loopback, retry_base_s=5.0):
        hook = endpoint(db, f"http://hooks.invalid:{rx.port}/a\x7fb")
        send_test(db, hook)
        wait_until(lambda: deliveries(db, hook)[0].last_error, 10, "the failure stored")
        [d] = deliveries(db, hook)
    assert "control characters" in (d.last_error or "")
    assert (d.status, d.attempts, rx.received) == ("pending", 1, [])


def test_the_address_is_checked_again_at_every_delivery(db: Database) -> None:
    """A name that resolved to a public address when registered, and to loopback now (DNS
    rebinding), is refused: nothing is sent."""
    with receiving() as rx, dispatching(db, allow="", resolve=lambda host, port: ["127.0.0.1"]):
        hook = endpoint(db, f"http://rebound.invalid:{rx.port}/hook")
        send_test(db, hook)
        wait_until(lambda: deliveries(db, hook)[0].attempts >= 2, 60, "two refused attempts")
    [d] = deliveries(db, hook)
    assert d.status == "pending" and (d.last_error or "").startswith("refused: ")
    assert "loopback" in (d.last_error or "")
    assert rx.received == []


def test_retries_end_after_their_time_and_the_endpoint_is_marked_failing(db: Database) -> None:
    """A day of failures (here a second) marks the endpoint failing: nothing more is sent
    to it, the delivery is held, not dropped, and goes again once the endpoint is enabled
    (test_webhook_delivery.py follows a whole outage)."""
    with receiving(answer=answers(503)) as rx, dispatching(db, retry_for_s=1.0):
        hook = endpoint(db, rx.url)
        send_test(db, hook)
        wait_until(lambda: failing(db, hook), 60, "the endpoint marked failing")
        tried = len(rx.received)
        assert tried >= 2  # retried before it gave up
        time.sleep(0.3)
        [held] = deliveries(db, hook)
        assert held.status == "pending" and held.attempts == tried == len(rx.received)
        assert "503" in (failing(db, hook) or "")
        with db.writer() as s:
            found = s.get(WebhookEndpoint, hook.id)
            assert found is not None
            update_endpoint(s, found, {"enabled": True})
        # enabled again: the held delivery is tried again (the receiver still fails)
        wait_until(lambda: len(rx.received) > tried, 60, "a delivery after enabling")


def failing(db: Database, hook: WebhookEndpoint) -> str | None:
    """Why the endpoint is marked failing; None while it is not."""
    with db.reader() as s:
        found = s.get(WebhookEndpoint, hook.id)
        assert found is not None
        return found.failing_reason if found.failing_since is not None else None


def test_410_gone_marks_the_endpoint_failing_at_once(db: Database) -> None:
    with receiving(answer=answers(410)) as rx, dispatching(db):
        hook = endpoint(db, rx.url)
        send_test(db, hook)
        wait_until(lambda: failing(db, hook), 60, "the endpoint marked failing")
        time.sleep(0.3)
        assert len(rx.received) == 1
    assert "410" in (failing(db, hook) or "")
    assert [d.status for d in deliveries(db, hook)] == ["pending"]  # held, not dropped


@pytest.mark.slow
def test_an_answer_that_never_comes_is_a_failure_within_the_timeout(db: Database) -> None:
    def slow(n: int) -> tuple[int, dict[str, str], bytes]:
        if n == 0:
            time.sleep(4)
        return 200, {}, b""

    with receiving(answer=slow) as rx, dispatching(db):
        hook = endpoint(db, rx.url)
        send_test(db, hook)
        done = settled(db, hook)
    assert done.attempts == 2 and len(rx.received) == 2


def test_two_dispatchers_send_each_delivery_once(db: Database) -> None:
    with receiving() as rx:
        hook = endpoint(db, rx.url)
        sent = send_test(db, hook, 24)
        # Time enough that no attempt times out on a busy machine and is sent again.
        slow = {"timeout_s": 20.0, "connect_timeout_s": 10.0}
        with dispatching(db, **slow), dispatching(db, **slow):
            got: list[Received] = rx.wait_for(24)
            wait_until(
                lambda: all(d.status == "delivered" for d in deliveries(db, hook)), 60, "all"
            )
    assert sorted(r.webhook_id for r in got) == sorted(sent)
    assert all(d.attempts == 1 for d in deliveries(db, hook))


def test_the_log_forgets_ended_deliveries_past_its_age_and_keeps_pending_ones(
    db: Database,
) -> None:
    hook = endpoint(db, "https://hooks.example/in")
    done, waiting = send_test(db, hook, 2)
    month_ago = db_ago(31 * 86400)
    with db.writer() as s:
        mine = WebhookDelivery.endpoint_id == hook.id
        s.execute(update(WebhookDelivery).where(mine).values(created_at=month_ago))
        events = WebhookEvent.id.in_([done, waiting])
        s.execute(update(WebhookEvent).where(events).values(created_at=month_ago))
        ended = WebhookDelivery.event_id == done
        s.execute(update(WebhookDelivery).where(ended).values(status="delivered"))
    with db.writer() as s:
        assert purge_log(s, older_than_s=30 * 86400) == 1  # the module's others are new
    assert [d.event_id for d in deliveries(db, hook)] == [waiting]
    with db.reader() as s:
        kept = s.scalars(select(WebhookEvent.id).where(WebhookEvent.id.in_([done, waiting])))
        assert list(kept) == [waiting]

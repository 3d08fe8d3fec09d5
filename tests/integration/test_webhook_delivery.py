"""Webhook delivery that loses nothing and can be watched, against real receivers on loopback:
a receiver's outage past the day of retries holds its events (the one that gave up among
them) and sends them in order once the endpoint is enabled; the day counts from a delivery's
first attempt, not its event; a receiver that hangs holds its own endpoint's slot and no one
else's; delivery paused holds every event until resumed; each failed attempt and each
failing mark is logged, each attempt counted by outcome, a dispatcher that stopped shows as
degraded, and /health never waits on reading any of it. On SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import delete, text, update

from api.services.webhooks import DeliveryWatch
from core.db import Database, WebhookDelivery, WebhookEndpoint, WebhookEvent, db_ago
from core.webhooks.deliveries import backlog, mark_failing
from core.webhooks.delivery_state import (
    DeliveryStatus,
    delivery_state,
    pause_delivery,
    resume_delivery,
)
from core.webhooks.dispatcher import CONCURRENCY
from core.webhooks.endpoints import update_endpoint
from core.webhooks.outbox import TEST_EVENT, record_event
from core.webhooks.sender import AttemptOutcome
from tests.integration.test_webhook_dispatcher import (
    answers,
    deliveries,
    dispatching,
    endpoint,
    receiving,
    send_test,
    settled,
)
from tests.service import wait_until

WEBHOOK_ATTEMPTS_PER_KEY = CONCURRENCY // 2


@pytest.fixture(autouse=True)
def _nothing_left(db: Database) -> Iterator[None]:
    """Each test starts with no endpoint, so none of its dispatchers sends another's, and
    with delivery not paused."""
    yield
    with db.writer() as s:
        s.execute(delete(WebhookEndpoint))
        resume_delivery(s)


def failing_since(db: Database, hook: WebhookEndpoint) -> object:
    with db.reader() as s:
        found = s.get(WebhookEndpoint, hook.id)
        assert found is not None
        return found.failing_since


def enable(db: Database, hook: WebhookEndpoint) -> None:
    with db.writer() as s:
        found = s.get(WebhookEndpoint, hook.id)
        assert found is not None
        update_endpoint(s, found, {"enabled": True})


def all_delivered(db: Database, hook: WebhookEndpoint) -> bool:
    return all(d.status == "delivered" for d in deliveries(db, hook))


def test_an_outage_past_the_day_of_retries_loses_nothing(db: Database) -> None:
    """The first event is retried for its day (here a second), the endpoint is marked
    failing, and the events after it are held, not dropped: once the endpoint is enabled,
    all of them go, the one that gave up first, in the order they were written."""
    down = threading.Event()
    down.set()

    def answer(n: int) -> tuple[int, dict[str, str], bytes]:
        return (503 if down.is_set() else 200), {}, b""

    with receiving(answer=answer) as rx, dispatching(db, retry_for_s=1.0):
        hook = endpoint(db, rx.url)
        first = send_test(db, hook)
        wait_until(lambda: failing_since(db, hook), 60, "the endpoint marked failing")
        later = send_test(db, hook, 3)
        tried = len(rx.received)
        time.sleep(0.5)
        assert len(rx.received) == tried  # held: nothing goes to a failing endpoint
        assert [d.status for d in deliveries(db, hook)] == ["pending"] * 4
        down.clear()
        enable(db, hook)
        wait_until(lambda: all_delivered(db, hook), 60, "every held event delivered")
        sent = [r.webhook_id for r in rx.received[tried:]]
    assert sent == first + later


def test_the_day_of_retries_counts_from_the_first_attempt_not_the_event(db: Database) -> None:
    """An event two days old whose first attempt (after an outage of the service, or of its
    database) fails is retried, not given up on the spot."""
    with receiving(answer=answers(500, 200)) as rx, dispatching(db, retry_for_s=3600.0):
        hook = endpoint(db, rx.url)
        with db.writer() as s:  # written two days ago: one transaction, so none claims it new
            event_id = record_event(s, owner=hook.owner, type=TEST_EVENT, data={},
                                    endpoint_id=hook.id)  # fmt: skip
            two_days = db_ago(2 * 86400)
            s.execute(update(WebhookEvent).where(WebhookEvent.id == event_id)
                      .values(created_at=two_days))  # fmt: skip
            s.execute(update(WebhookDelivery).where(WebhookDelivery.event_id == event_id)
                      .values(created_at=two_days, next_attempt_at=two_days))  # fmt: skip
        done = settled(db, hook)
    assert done.attempts == 2 and len(rx.received) == 2
    assert failing_since(db, hook) is None


@dataclass(frozen=True)
class PastHanging:
    delay_s: float  # from the other key's event to its arrival
    delivered: bool  # the one that arrived is that event
    hanging: int  # attempts the hanging receiver took meanwhile


def one_event_past_hanging_receivers(
    db: Database, stick: Callable[[str], None], attempts: int
) -> PastHanging:
    """With a dispatcher (10 s timeout): `stick(url)` queues events for endpoints of a
    receiver that never answers; once it holds `attempts` of them, one event of another
    key's endpoint is sent. What happened to it."""
    release = threading.Event()

    def hang(n: int) -> tuple[int, dict[str, str], bytes]:
        release.wait(30)
        return 200, {}, b""

    with receiving(answer=hang) as slow, receiving() as fast, dispatching(db, timeout_s=10.0):
        try:
            stick(slow.url)
            slow.wait_for(attempts)
            quick = endpoint(db, fast.url)
            sent_at = time.time()
            [event_id] = send_test(db, quick)
            [got] = fast.wait_for(1)
            hanging = len(slow.received)
        finally:
            release.set()
    return PastHanging(got.at - sent_at, got.webhook_id == event_id, hanging)


def test_a_receiver_that_hangs_holds_only_its_own_endpoints_slot(db: Database) -> None:
    """A dozen events to a receiver that never answers within the timeout, then one to
    another: that one arrives at once, not after the hanging ones' timeouts, and the hanging
    receiver is sent one at a time (TRAINQ_WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT, 1)."""

    def stick(url: str) -> None:
        send_test(db, endpoint(db, url), 12)

    past = one_event_past_hanging_receivers(db, stick, 1)
    assert past.delivered
    assert past.delay_s < 3.0, past.delay_s  # not a hanging attempt's 10 s
    assert past.hanging == 1


def test_one_keys_hanging_endpoints_hold_at_most_half_of_the_dispatchers_attempts(
    db: Database,
) -> None:
    """One key's eight endpoints that never answer within the timeout, with events queued
    for each, then one event of another key's: it arrives at once, not after the hanging
    attempts' timeouts (a key has at most half of a dispatcher's attempts under way)."""
    attacker = f"k_{uuid.uuid4().hex[:12]}"

    def stick(url: str) -> None:
        for _ in range(8):
            send_test(db, endpoint(db, url, owner=attacker), 3)

    past = one_event_past_hanging_receivers(db, stick, WEBHOOK_ATTEMPTS_PER_KEY)
    assert past.delivered
    assert past.delay_s < 3.0, past.delay_s  # not a hanging attempt's 10 s
    assert past.hanging == WEBHOOK_ATTEMPTS_PER_KEY


def test_two_dispatchers_keep_one_attempt_at_a_time_to_an_endpoint(db: Database) -> None:
    """The bound on an endpoint's attempts under way is counted in the database, across
    dispatchers, and its events go oldest first."""
    lock, under_way, most = threading.Lock(), [0], [0]

    def slow(n: int) -> tuple[int, dict[str, str], bytes]:
        with lock:
            under_way[0] += 1
            most[0] = max(most[0], under_way[0])
        time.sleep(0.2)
        with lock:
            under_way[0] -= 1
        return 200, {}, b""

    with receiving(answer=slow) as rx:
        hook = endpoint(db, rx.url)
        sent = send_test(db, hook, 6)
        with dispatching(db), dispatching(db):
            got = rx.wait_for(6)
            wait_until(lambda: all_delivered(db, hook), 60, "all delivered")
    assert most[0] == 1
    assert [r.webhook_id for r in got] == sent


def test_paused_delivery_holds_every_event_until_it_is_resumed(db: Database) -> None:
    """Paused (as a restored copy of the database starts): events are written and held,
    none sent, none lost; resumed, they go in the order they were written."""
    with receiving() as rx, dispatching(db):
        hook = endpoint(db, rx.url)
        with db.writer() as s:
            assert pause_delivery(s, by="trainq restore", reason="a restored copy")
        with db.writer() as s:
            assert not pause_delivery(s, by="someone else")  # paused already: unchanged
        sent = send_test(db, hook, 3)
        time.sleep(1.0)
        assert rx.received == []
        with db.reader() as s:
            state = delivery_state(s)
            assert (state.status, state.paused_by) == (DeliveryStatus.paused, "trainq restore")
            assert backlog(s).held == 3
        with db.writer() as s:
            assert resume_delivery(s)
        got = rx.wait_for(3)
    assert [r.webhook_id for r in got] == sent


def test_a_dispatcher_that_stopped_shows_as_degraded(db: Database) -> None:
    with dispatching(db):
        wait_until(
            lambda: _status(db, 30.0) is DeliveryStatus.ok, 10, "a dispatcher's pass recorded"
        )
    time.sleep(1.5)  # no dispatcher runs now
    assert _status(db, 1.0) is DeliveryStatus.degraded


def _status(db: Database, stale_after_s: float) -> DeliveryStatus:
    with db.reader() as s:
        return delivery_state(s, stale_after_s=stale_after_s).status


def test_each_failed_attempt_and_the_failing_mark_are_logged(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainq.webhooks")
    with receiving(answer=answers(503)) as rx, dispatching(db, retry_for_s=1.0):
        hook = endpoint(db, rx.url)
        [event_id] = send_test(db, hook)
        wait_until(lambda: failing_since(db, hook), 60, "the endpoint marked failing")
        attempts = len(rx.received)
    lines = [r.getMessage() for r in caplog.records if hook.id in r.getMessage()]
    failed = [line for line in lines if f"of event {event_id} to endpoint {hook.id} failed" in line]
    assert len(failed) == attempts >= 2
    assert all("(rejected): answered 503" in line for line in failed)
    [marked] = [line for line in lines if "marked failing" in line]
    assert f"endpoint {hook.id} marked failing: no delivery succeeded for 1 s" in marked


def test_attempts_are_counted_by_outcome_and_the_backlog_measured(db: Database) -> None:
    with db.reader() as s:
        before = backlog(s).attempts
    with receiving(answer=answers(500, 200)) as rx, dispatching(db):
        hook = endpoint(db, rx.url)
        send_test(db, hook)
        settled(db, hook)
    with db.reader() as s:
        after = backlog(s)
    grew = {kind: after.attempts[kind] - before[kind] for kind in AttemptOutcome}
    assert grew == {"delivered": 1, "rejected": 1, "no_answer": 0, "not_sent": 0}
    assert (after.pending, after.held, after.oldest_pending_s) == (0, 0, 0.0)

    held = endpoint(db, "https://hooks.example/in")
    send_test(db, held, 2)
    with db.writer() as s:
        assert mark_failing(s, endpoint_id=held.id, why="a test")
    time.sleep(0.1)
    with db.reader() as s:
        now = backlog(s)
    assert (now.pending, now.held, now.endpoints_failing) == (2, 2, 1)
    assert now.oldest_pending_s >= 0.1


def test_health_never_waits_for_a_stalled_read_of_the_delivery_state(db: Database) -> None:
    """/health's view of delivery (api.services.webhooks.DeliveryWatch) answers at once from
    its last read while a read is stuck behind a lock, and shows nothing once that read is
    stale, then the state again once the database answers."""
    if db.engine.dialect.name != "postgresql":
        pytest.skip("a SQLite reader is never blocked by a writer")
    watch = DeliveryWatch(db, fresh_s=0.1, stale_s=1.0)
    wait_until(watch.look, 10, "a first read")
    with db.engine.connect() as held:
        held.execute(text("LOCK TABLE webhook_delivery_state IN ACCESS EXCLUSIVE MODE"))
        time.sleep(0.3)  # a read has started, and waits for the lock
        slowest, seen = 0.0, []
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            started = time.monotonic()
            seen.append(watch.look())
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.05)
        held.rollback()
    assert slowest < 0.05, slowest
    assert seen[0] is not None and seen[-1] is None  # the last read, then none: it is stale
    wait_until(watch.look, 10, "a read once the lock is gone")

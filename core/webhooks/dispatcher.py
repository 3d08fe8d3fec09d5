"""The dispatcher: it polls the database for due deliveries (a read, cheap enough to do twice
a second, and again as soon as an attempt ends), claims a few under a lease, fairly across
endpoints, checks each URL's addresses again, and sends them, several at once, then stores
each outcome, logging each failure. Any number may run (every claim is a guarded UPDATE);
`trainq serve` runs one in a thread beside the API (start_in_thread). A dispatcher killed
mid-delivery leaves it to whichever finds it due once its lease ends: the same event, the
same `webhook-id`. Each writes that it is alive every few seconds (/health reads it).
See docs/operations.md ("Webhooks")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from sqlalchemy.exc import SQLAlchemyError

from core.config import Settings
from core.db import Database
from core.webhooks import deliveries, delivery_state
from core.webhooks.addresses import AddressPolicy, Resolver, UnsafeUrl, checked_target
from core.webhooks.addresses import system_resolver as default_resolver
from core.webhooks.deliveries import Claimed, Recorded, Retries
from core.webhooks.sender import Outcome, failed, http_client, post
from core.webhooks.signing import headers

log = logging.getLogger("trainq.webhooks")
CONCURRENCY = 8  # deliveries one dispatcher has under way at once
# One key's deliveries under way at once, across dispatchers: its endpoints that hang (a key
# may have 20) leave the other half of a dispatcher's attempts to other keys.
PER_OWNER = CONCURRENCY // 2
AWAY_PAUSE_MAX_S = 5.0  # the longest wait between claims while the database is away
LOG_KEPT_S = 30 * 86400.0  # ended deliveries older than this leave the log
PURGE_EVERY_S = 3600.0
MIN_SEND_S = 1.0  # what a slow name resolution leaves an attempt at least


@dataclass(frozen=True)
class Pace:
    """How often a dispatcher looks, how long it waits: the same in every deployment (the
    convention's advice: retries for about a day), shorter in tests."""

    poll_s: float = 0.5
    connect_timeout_s: float = 3.0
    retry_base_s: float = 5.0
    retry_for_s: float = 86400.0
    # A claim is held this many times an attempt's longest (Settings.webhook_timeout_s):
    # never taken again while it may still be under way, soon taken after a crash.
    lease_factor: float = 6.0

    @property
    def retries(self) -> Retries:
        return Retries(self.retry_base_s, self.retry_for_s)


class Dispatcher:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        resolve: Resolver = default_resolver,
        pace: Pace = Pace(),
    ) -> None:
        self.db = db
        self.settings = settings
        self.policy = AddressPolicy.from_setting(settings.webhook_allow_hosts)
        self.pace = pace
        self.lease_s = pace.lease_factor * settings.webhook_timeout_s
        self.resolve = resolve
        self.rng = random.Random()
        self.sent = 0  # attempts made, whatever their outcome
        self.passed = -delivery_state.BEAT_EVERY_S  # time.monotonic() of the last pass written
        self.wake = asyncio.Event()  # set as an attempt ends: its endpoint's slot is free
        # Its own threads for what blocks (the database, name resolution): one per delivery
        # under way and one for claims, so that no delivery waits for a thread.
        self.threads = ThreadPoolExecutor(CONCURRENCY + 1, thread_name_prefix="trainq-webhooks")
        self.loop: asyncio.AbstractEventLoop  # run's own

    async def run(self, stop: threading.Event) -> None:
        """Deliver until `stop` is set; attempts under way then are ended, left to their
        lease."""
        s = self.settings
        self.loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Task[None]] = set()
        pause, purged = self.pace.poll_s, 0.0
        connect_s = min(self.pace.connect_timeout_s, s.webhook_timeout_s)
        async with http_client(connect_s, s.webhook_timeout_s) as client:
            while not stop.is_set():
                free = CONCURRENCY - len(in_flight)
                try:
                    claimed = await self.loop.run_in_executor(self.threads, self.claim, free)
                    if time.monotonic() - purged > PURGE_EVERY_S:
                        purged = time.monotonic()
                        await self.loop.run_in_executor(self.threads, self.purge)
                    pause = self.pace.poll_s
                except SQLAlchemyError as e:
                    why = getattr(e, "orig", None) or e
                    log.warning("webhooks: the database is away (%s); trying again", why)
                    claimed, pause = [], min(pause * 2, AWAY_PAUSE_MAX_S)
                except Exception:  # a bug must not end the deliveries: the next pass tries again
                    log.exception("webhooks: a claim failed")
                    claimed, pause = [], min(pause * 2, AWAY_PAUSE_MAX_S)
                for c in claimed:
                    task = asyncio.create_task(self.deliver(client, c))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                if len(claimed) < free or not free:
                    await self.rest(pause)
            # Ended here, not by the loop's own teardown: their connections close with them.
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
        self.threads.shutdown(wait=False)

    async def rest(self, pause_s: float) -> None:
        """Wait `pause_s`, or less if an attempt ends meanwhile (its endpoint may have more)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), pause_s)
        self.wake.clear()

    def claim(self, limit: int) -> list[Claimed]:
        """A pass: say that this dispatcher is alive (every few seconds), then claim up to
        `limit` due deliveries."""
        if time.monotonic() - self.passed >= delivery_state.BEAT_EVERY_S:
            with self.db.writer() as s:
                delivery_state.record_pass(s)
            self.passed = time.monotonic()
        if not limit:
            return []
        with self.db.reader() as s:
            if not deliveries.any_due(s):
                return []
        per_endpoint = self.settings.webhook_max_in_flight_per_endpoint
        with self.db.writer() as s:
            return deliveries.claim_due(
                s,
                lease_s=self.lease_s,
                limit=limit,
                per_endpoint=per_endpoint,
                per_owner=PER_OWNER,
            )

    def purge(self) -> None:
        with self.db.writer() as s:
            deliveries.purge_log(s, older_than_s=LOG_KEPT_S)

    async def deliver(self, client: httpx.AsyncClient, c: Claimed) -> None:
        """One attempt of `c`, its outcome stored (an attempt that raised is a failure, so
        that it backs off like any other); nothing it meets ends the dispatcher."""
        try:
            try:
                outcome = await self.attempt(client, c)
            except Exception as e:  # no request could be made of it: a failure, backed off
                log.exception("webhooks: delivery %s could not be sent", c.id)
                why = f"not sent: {type(e).__name__}: {e}"
                outcome = failed(time.monotonic(), None, why, sent=False)
            await self.loop.run_in_executor(self.threads, self.record, c, outcome)
        except Exception:  # a bug or an outage in one delivery: its lease brings it back
            log.exception("webhooks: delivery %s of event %s failed", c.id, c.event_id)
        finally:
            self.wake.set()

    async def attempt(self, client: httpx.AsyncClient, c: Claimed) -> Outcome:
        """Check the URL's addresses now (DNS may have changed since the last attempt), then
        POST to the address checked, signed for this attempt's timestamp."""
        started = time.monotonic()
        timeout_s = self.settings.webhook_timeout_s
        resolving = self.loop.run_in_executor(
            self.threads, checked_target, c.url, self.policy, self.resolve
        )
        try:
            target = await asyncio.wait_for(resolving, timeout_s)
        except UnsafeUrl as e:
            return failed(started, None, f"refused: {e}", sent=False)
        except TimeoutError:
            return failed(started, None, "the URL's host did not resolve in time", sent=False)
        body = c.body.encode()
        signed = headers(c.secret, c.event_id, int(time.time()), body)
        self.sent += 1
        left_s = max(timeout_s - (time.monotonic() - started), MIN_SEND_S)
        return await post(client, target, signed, body, left_s)

    def record(self, c: Claimed, outcome: Outcome) -> None:
        with self.db.writer() as s:
            recorded = deliveries.record_outcome(s, c, outcome, self.pace.retries, self.rng)
        tell(c, outcome, recorded)


def tell(c: Claimed, outcome: Outcome, recorded: Recorded) -> None:
    """The log's line for an attempt that failed, and for an endpoint it marked failing."""
    if not recorded.kept:
        log.warning("webhooks: delivery %s outlived its lease; its outcome is dropped", c.id)
        return
    if outcome.delivered:
        return
    then = (
        f"next attempt in {recorded.again_in_s or 0:.0f} s" if recorded.failing is None else "held"
    )
    log.warning(
        "webhooks: attempt %d of event %s to endpoint %s failed (%s): %s; %s",
        c.attempts, c.event_id, c.endpoint_id, outcome.kind.value, outcome.error, then,
    )  # fmt: skip
    if recorded.failing is not None:
        log.warning(
            "webhooks: endpoint %s marked failing: %s; its events are held until it is "
            "enabled again (PATCH /webhooks/%s enabled=true, or `trainq webhook enable`)",
            c.endpoint_id, recorded.failing, c.endpoint_id,
        )  # fmt: skip


def start_in_thread(settings: Settings) -> threading.Event:
    """A dispatcher on a daemon thread of its own (its own event loop and database engine),
    for as long as the process runs; set the answer to stop it."""
    stop = threading.Event()

    def run() -> None:
        db = Database.from_settings(settings)
        try:
            asyncio.run(Dispatcher(db, settings).run(stop))
        finally:
            db.dispose()

    threading.Thread(target=run, name="trainq-webhooks", daemon=True).start()
    return stop

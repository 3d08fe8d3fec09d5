"""Server-Sent Events for one job: step points, epoch ends and status changes, each with
its stream id as the SSE id, so a client that reconnects with Last-Event-ID resumes exactly
where it stopped.

Every step is sent once, in order, or said to be gone. Where the Redis stream lacks steps
(it was trimmed, lost or expired), they come from the database, which stores them at each
epoch end: while the job runs the follower waits for them (with keep-alives); once the job
ended, steps that neither holds are named by a `gap` event (`from`, `to`). The stream of a
job that ended closes, also when Redis never got (or lost) the end, and while something
(a superseded attempt) still adds to it: the feed asks the database every few seconds, and
the database's status closes it, keyed after everything the follower has seen.

Followers are bounded. Each API process holds at most `sse_max_per_process` streams open,
and each key `sse_max_per_key` of them; past either, 429 (TooManyFollowers). A follower
whose connection leaves more than `sse_max_lag` live entries untaken (its client reads
slower than the job trains, or stopped reading) is sent a `lagging` event, keyed (SSE id)
with the last entry it was sent, and its stream closes: it resumes with that Last-Event-ID,
from Redis or the database, at its own pace. What a follower holds in this process is so
bounded by `sse_max_lag` entries."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from enum import Enum
from typing import Any

from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.deps import read
from core.config import Settings
from core.db import Database
from core.errors import TooManyFollowers
from core.spec import JobStatus
from core.store import epoch_metrics, get_job, step_rows
from core.stream import (
    END,
    EPOCH,
    STEP,
    EntryId,
    InvalidEntryId,
    parse_entries,
    stream_key,
)

log = logging.getLogger("trainq.api")
IDLE_BLOCK_MS = 5000
GAP_POLL_S = 1.0  # how often a follower waiting for missing steps asks the database again
# How often a feed asks the database whether its job ended, however busy the stream: a
# superseded attempt (or any writer) may go on adding to a stream whose end was lost.
ENDED_POLL_S = 3.0
DB_PAGE = 2000
KEEP_ALIVE = ": keep-alive\n\n"
# A follower's last words when Redis or the database fails under a stream already started:
# reconnect in 5 s (with Last-Event-ID, as an EventSource does by itself).
RETRY = "retry: 5000\n\n"
ADMIN_ONLY = frozenset({"worker"})  # status fields no event carries (see _for_every_key)

Batch = list[tuple[EntryId, str]]  # (entry id, the SSE text of that entry), in order


class Signal(Enum):
    IDLE = "nothing new: send a keep-alive"
    BEHIND = "the feed let go of this follower: read Redis directly"
    ENDED = "the job ended and Redis holds no end: close from the database"
    LAGGING = "the connection left too many live entries untaken: say so and close"
    AWAY = "Redis or the database stopped answering the feed: hint a retry and close"


Item = Batch | Signal


class _Inbox:
    """The live items the feed hands one follower, at most `max_entries` entries untaken.
    Past that the feed lets go of the follower and what waits is dropped: a follower still
    reading what came before its live feed (`live` False) reads Redis again once it gets
    there (BEHIND); one that has caught up is lagging (its connection does not keep up)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries = 0
        self.live = False
        self.q: asyncio.Queue[Item] = asyncio.Queue()

    def offer(self, item: Item) -> bool:
        """Queue `item`; False if the follower is let go instead. A batch always fits an
        empty inbox, however small the bound."""
        size = len(item) if isinstance(item, list) else 0
        if self.entries and self.entries + size > self.max_entries:
            self.drop(Signal.LAGGING if self.live else Signal.BEHIND)
            return False
        self.entries += size
        self.q.put_nowait(item)
        return True

    def drop(self, signal: Signal) -> None:
        """Let go: what waits is dropped, `signal` is all that is left to read."""
        while not self.q.empty():
            self.q.get_nowait()
        self.entries = 0
        self.q.put_nowait(signal)

    async def get(self) -> Item:
        item = await self.q.get()
        if isinstance(item, list):
            self.entries -= len(item)
        return item


def sse(event_id: EntryId, kind: str, data: dict[str, Any]) -> str:
    return f"id: {event_id!s}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"


def _last_needed(key: EntryId) -> int:
    """The last step a follower must have seen before the entry `key`."""
    return key.step - 1 if key.seq == STEP else key.step


def _top_id(top: Any) -> EntryId:
    """The id of the one entry in `top` (XREVRANGE's, or a batch's last), or 0-0 for none."""
    return EntryId.of_stream(top[0][0]) if top else EntryId(0, 0)


def _batch(raw: Any) -> Batch:
    batch: Batch = []
    for eid, kind, data in parse_entries(raw):
        key = EntryId.of_stream(eid)
        batch.append((key, sse(key, kind, {"type": kind, **_for_every_key(kind, data)})))
    return batch


def _for_every_key(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """An entry as every key that may read the job may see it: the stream is encoded once
    for all its followers, so what is for admins only (the worker's name, which carries
    its host's: GET /jobs/{id} shows it to an admin key) is left out for everyone. Workers
    no longer publish it; this covers entries older workers wrote (a stream lives 7 days)."""
    if kind != "status":
        return data
    return {k: v for k, v in data.items() if k not in ADMIN_ONLY}


class _Feed:
    """One job's live entries, read once from Redis for every follower in this process:
    with a hundred followers that is one blocking XREAD, one parse and one SSE encoding per
    batch instead of a hundred of each. A follower that leaves too many entries untaken is
    let go (_Inbox)."""

    def __init__(self, hub: EventHub, job_id: str, cursor: EntryId) -> None:
        self.hub = hub
        self.job_id = job_id
        self.cursor = cursor
        self.followers: set[_Inbox] = set()
        self.task = asyncio.create_task(self._run(), name=f"trainq-feed-{job_id}")

    async def _run(self) -> None:
        key = stream_key(self.job_id)
        asked_db = time.monotonic()
        gone = Signal.BEHIND  # once the feed is gone: read Redis directly
        try:
            while self.followers:
                raw: Any = await self.hub.ar.xread(
                    {key: str(self.cursor)}, count=500, block=IDLE_BLOCK_MS
                )
                if raw:
                    entries = raw[0][1]
                    self.cursor = _top_id(entries[-1:])  # past skipped entries too
                    if batch := _batch(entries):
                        self._send(batch)
                    if self.cursor.seq == END:
                        return
                    if time.monotonic() - asked_db < ENDED_POLL_S:
                        continue
                asked_db = time.monotonic()
                if await read(self.hub.db, _has_ended, self.job_id):
                    self._send(Signal.ENDED)  # ended with no end in Redis (expired, lost)
                    return
                if not raw:
                    self._send(Signal.IDLE)
        except (RedisError, SQLAlchemyError) as e:
            log.warning("live feed of job %s stopped: %s", self.job_id, _cause(e))
            gone = Signal.AWAY
        except Exception:
            log.exception("live feed of job %s stopped", self.job_id)
        finally:
            if self.hub.feeds.get(self.job_id) is self:
                del self.hub.feeds[self.job_id]
            for inbox in list(self.followers):
                inbox.offer(gone)

    def _send(self, item: Item) -> None:
        for inbox in list(self.followers):
            if not inbox.offer(item):
                self.followers.discard(inbox)
                if inbox.live:
                    self.hub.lagging += 1


class EventHub:
    """The live feeds of one API process, one per job that has followers, and the count of
    its open event streams (per key, and in all)."""

    def __init__(self, db: Database, ar: AsyncRedis, settings: Settings) -> None:
        self.db = db
        self.ar = ar
        self.max_per_key = settings.sse_max_per_key
        self.max_per_process = settings.sse_max_per_process
        self.max_lag = settings.sse_max_lag
        self.feeds: dict[str, _Feed] = {}
        self.open: Counter[str] = Counter()  # owner id -> its open streams
        self.lagging = 0  # followers let go as lagging, for /metrics

    def admit(self, owner: str) -> None:
        """Count a new stream of `owner`'s, or refuse it (TooManyFollowers). Each admitted
        stream is released once (EventStreamResponse)."""
        if self.open.total() >= self.max_per_process:
            raise TooManyFollowers("sse_max_per_process", self.max_per_process)
        if self.open[owner] >= self.max_per_key:
            raise TooManyFollowers("sse_max_per_key", self.max_per_key)
        self.open[owner] += 1

    def release(self, owner: str) -> None:
        self.open[owner] -= 1
        if self.open[owner] <= 0:
            del self.open[owner]

    def follow(self, job_id: str, cursor: EntryId) -> _Inbox:
        """Live batches from now on (and possibly some from before: the follower skips
        what it has seen). `cursor` starts a new feed: the last entry the stream holds."""
        feed = self.feeds.get(job_id)
        if feed is None:
            feed = self.feeds[job_id] = _Feed(self, job_id, cursor)
        inbox = _Inbox(self.max_lag)
        feed.followers.add(inbox)
        return inbox

    def leave(self, job_id: str, q: _Inbox) -> None:
        feed = self.feeds.get(job_id)
        if feed is not None:
            feed.followers.discard(q)
            if not feed.followers:
                del self.feeds[job_id]
                feed.task.cancel()


class EventStreamResponse(StreamingResponse):
    """One admitted follower's response: its slot is released however the stream ends
    (the job's end, lagging, the client gone, the server stopping)."""

    def __init__(self, hub: EventHub, owner: str, content: AsyncIterator[str]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.hub = hub
        self.owner = owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.hub.release(self.owner)


class _FeedAway(Exception):
    """The live feed of a follower's job stopped on a Redis or database error."""


def _cause(e: Exception) -> str:
    """The error without the statement SQLAlchemy quotes with it."""
    return str(e.orig if isinstance(e, DBAPIError) else e)[:300]


def follow_events(
    hub: EventHub, db: Database, ar: AsyncRedis, owner: str, job_id: str, last_event_id: str | None
) -> EventStreamResponse:
    """The event stream of `job_id` for a follower of `owner`'s, admitted (or refused with
    TooManyFollowers) now."""
    hub.admit(owner)
    follower = _Follower(hub, db, ar, job_id, _resumed_at(last_event_id))
    return EventStreamResponse(hub, owner, follower.events())


def _resumed_at(last_event_id: str | None) -> EntryId:
    """The entry a follower has seen last. Junk, or a step past any run, starts it from the
    beginning, as no Last-Event-ID does."""
    try:
        return EntryId.parse(last_event_id or "")
    except InvalidEntryId:
        return EntryId(0, 0)


class _Follower:
    """One client's read of a job's events, from `cursor` (the last entry it has seen)."""

    def __init__(
        self, hub: EventHub, db: Database, ar: AsyncRedis, job_id: str, cursor: EntryId
    ) -> None:
        self.hub = hub
        self.db = db
        self.ar = ar
        self.job_id = job_id
        self.key = stream_key(job_id)
        self.cursor = cursor
        self.done = cursor.seq == END  # it saw the end already
        self.stalled = False  # at a gap the database cannot fill yet

    async def events(self) -> AsyncIterator[str]:
        """The stream. Redis or the database failing once it has started (a status and
        headers sent already, so no 503 can be) ends it cleanly with a retry hint: the
        client reconnects with Last-Event-ID and misses nothing."""
        try:
            async for chunk in self._events():
                yield chunk
        except (RedisError, SQLAlchemyError, _FeedAway) as e:
            log.warning("the event stream of job %s ended early: %s", self.job_id, _cause(e))
            yield RETRY

    async def _events(self) -> AsyncIterator[str]:
        while not self.done:
            # Join the live feed first, then read what came before it from Redis: nothing
            # falls between the two, and what both hold is sent once (by entry id).
            top: Any = await self.ar.xrevrange(self.key, count=1)
            # The top entry's id as Redis holds it, whatever the entry (one no writer of
            # ours made is skipped when read, but it still marks where the live feed starts).
            q = self.hub.follow(self.job_id, _top_id(top))
            try:
                async for chunk in self._relay(q):
                    yield chunk
            finally:
                self.hub.leave(self.job_id, q)
            if self.stalled:
                self.stalled = False
                yield KEEP_ALIVE
                await asyncio.sleep(GAP_POLL_S)

    async def _relay(self, q: _Inbox) -> AsyncIterator[str]:
        """Until the end, a stall, or the feed lets go of this follower."""
        stored = False
        async for batch in self._stored():
            stored = True
            async for chunk in self._deliver(batch):
                yield chunk
            if self.done or self.stalled:
                return
        if not stored and await read(self.db, _has_ended, self.job_id):
            async for chunk in self._close():
                yield chunk
            return
        q.live = True
        while (item := await q.get()) is not Signal.BEHIND:
            if item is Signal.IDLE:
                yield KEEP_ALIVE
            elif item is Signal.LAGGING:
                self.done = True
                yield self._lagging()
                return
            elif item is Signal.ENDED:
                async for chunk in self._close():
                    yield chunk
                return
            elif item is Signal.AWAY:
                raise _FeedAway("its live feed stopped on a Redis or database error")
            else:
                async for chunk in self._deliver(item):
                    yield chunk
                if self.done or self.stalled:
                    return

    def _lagging(self) -> str:
        """The follower's last event: keyed with the last entry it was sent, so that an
        EventSource (or any client that keeps the last id) resumes right after it."""
        log.info("a follower of job %s is lagging at %s: dropped", self.job_id, self.cursor)
        return sse(self.cursor, "lagging", {"type": "lagging", "last_id": str(self.cursor)})

    async def _stored(self) -> AsyncIterator[Batch]:
        read_to = self.cursor  # past the entries read, skipped ones included
        while True:
            start = max(read_to, self.cursor).exclusive()
            raw: Any = await self.ar.xrange(self.key, min=start, max="+", count=500)
            if not raw:
                return
            read_to = _top_id(raw[-1:])
            if batch := _batch(raw):
                yield batch

    async def _deliver(self, batch: Batch) -> AsyncIterator[str]:
        for key, text in batch:
            if key <= self.cursor:
                continue
            if _last_needed(key) > self.cursor.step:
                async for chunk in self._fill(key):
                    yield chunk
                if self.stalled:
                    return
                if key <= self.cursor:
                    continue
            yield text
            self.cursor = key
            if key.seq == END:
                self.done = True
                return

    async def _fill(self, key: EntryId) -> AsyncIterator[str]:
        """The steps missing before entry `key`: from the database; if it lacks some, wait
        for them while the job runs, and once it ended say that they are gone."""
        ended = await read(self.db, _terminal_status, self.job_id)
        async for chunk in self._from_db():
            yield chunk
        last = _last_needed(key)
        if last <= self.cursor.step:
            return
        if ended is None:
            self.stalled = True
            return
        gone = {"type": "gap", "from": self.cursor.step + 1, "to": last}
        self.cursor = EntryId(last, STEP)
        yield sse(self.cursor, "gap", gone)

    async def _close(self) -> AsyncIterator[str]:
        """The end from the database: what it holds past the cursor, then the status."""
        async for chunk in self._from_db():
            yield chunk
        self.done = True
        ended = await read(self.db, _terminal_status, self.job_id)
        if ended is not None:
            step, payload = ended
            yield sse(EntryId(max(step, self.cursor.step), END), "status", payload)

    async def _from_db(self) -> AsyncIterator[str]:
        while rows := await read(self.db, _db_page, self.job_id, self.cursor):
            for key, kind, data in rows:
                self.cursor = key
                yield sse(key, kind, {"type": kind, **data})


def _db_page(s: Session, job_id: str, cursor: EntryId) -> list[tuple[EntryId, str, dict[str, Any]]]:
    """The stored steps and epoch ends after `cursor`, in order (a page of steps)."""
    after = cursor.step
    steps = step_rows(s, job_id=job_id, after=after, limit=DB_PAGE)
    last = steps[-1]["step"] if steps else after
    epochs = [e for e in epoch_metrics(s, job_id=job_id) if after <= e.step <= last]
    out = [(EntryId(p["step"], STEP), "step", p) for p in steps]
    out += [(EntryId(e.step, EPOCH), "epoch", _columns(e)) for e in epochs]
    return sorted((row for row in out if row[0] > cursor), key=lambda row: row[0])


def _columns(row: Any) -> dict[str, Any]:
    return {c.key: getattr(row, c.key) for c in row.__table__.columns if c.key != "job_id"}


def _has_ended(s: Session, job_id: str) -> bool:
    return _terminal_status(s, job_id) is not None


def _terminal_status(s: Session, job_id: str) -> tuple[int, dict[str, Any]] | None:
    job = get_job(s, job_id=job_id)
    if job is None or not JobStatus(job.status).terminal:
        return None
    payload: dict[str, Any] = {"type": "status", "status": job.status}
    if job.error_code:
        payload["error"] = {"code": job.error_code, "message": job.error_message}
    if job.result:
        payload["result"] = job.result
    return job.progress_step, payload

"""One client's event stream of a job: what it missed from Redis or the database, then
the live feed (api.events), each entry once and in order, or a `gap` event for steps that
are gone; resumable with Last-Event-ID. See docs/api.md."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from api.events import (
    DB_PAGE,
    GAP_POLL_S,
    KEEP_ALIVE,
    RETRY,
    Batch,
    EventHub,
    EventStreamResponse,
    Inbox,
    Signal,
    batch_of,
    cause,
    has_ended,
    sse,
    terminal_status,
    top_id,
)
from api.reads import read
from core.db import Database
from core.store import epoch_metrics, step_rows
from core.stream import END, EPOCH, STEP, EntryId, InvalidEntryId, stream_key

log = logging.getLogger("trainq.api")


def _last_needed(key: EntryId) -> int:
    """The last step a follower must have seen before the entry `key`."""
    return key.step - 1 if key.seq == STEP else key.step


class _FeedAway(Exception):
    """The live feed of a follower's job stopped on a Redis or database error."""


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
            log.warning("the event stream of job %s ended early: %s", self.job_id, cause(e))
            yield RETRY

    async def _events(self) -> AsyncIterator[str]:
        while not self.done:
            # Join the live feed first, then read what came before it from Redis: nothing
            # falls between the two, and what both hold is sent once (by entry id).
            top: Any = await self.ar.xrevrange(self.key, count=1)
            # The top entry's id as Redis holds it, whatever the entry (one no writer of
            # ours made is skipped when read, but it still marks where the live feed starts).
            q = self.hub.follow(self.job_id, top_id(top))
            try:
                async for chunk in self._relay(q):
                    yield chunk
            finally:
                self.hub.leave(self.job_id, q)
            if self.stalled:
                self.stalled = False
                yield KEEP_ALIVE
                await asyncio.sleep(GAP_POLL_S)

    async def _relay(self, q: Inbox) -> AsyncIterator[str]:
        """Until the end, a stall, or the feed lets go of this follower."""
        stored = False
        async for batch in self._stored():
            stored = True
            async for chunk in self._deliver(batch):
                yield chunk
            if self.done or self.stalled:
                return
        if not stored and await read(self.db, has_ended, self.job_id):
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
            read_to = top_id(raw[-1:])
            if batch := batch_of(raw):
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
        ended = await read(self.db, terminal_status, self.job_id)
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
        ended = await read(self.db, terminal_status, self.job_id)
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

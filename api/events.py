"""Server-Sent Events for one job: the live feed that reads a job's stream once for every
follower in this process (EventHub), and the bound on streams open at once (api.slots).
The follower's own read, resumable with Last-Event-ID, is api.event_follower.
See docs/api.md."""

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

from api.errors import RETRY_AFTER_S
from api.reads import read
from api.slots import KeySlots, SlotLimit
from core.config import Settings
from core.db import Database
from core.errors import ProcessBusy, TooManyFollowers
from core.spec import JobStatus
from core.store import get_job
from core.stream import (
    END,
    EntryId,
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


class Inbox:
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


def top_id(top: Any) -> EntryId:
    """The id of the one entry in `top` (XREVRANGE's, or a batch's last), or 0-0 for none."""
    return EntryId.of_stream(top[0][0]) if top else EntryId(0, 0)


def batch_of(raw: Any) -> Batch:
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
    let go (Inbox)."""

    def __init__(self, hub: EventHub, job_id: str, cursor: EntryId) -> None:
        self.hub = hub
        self.job_id = job_id
        self.cursor = cursor
        self.followers: set[Inbox] = set()
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
                    self.cursor = top_id(entries[-1:])  # past skipped entries too
                    if batch := batch_of(entries):
                        self._send(batch)
                    if self.cursor.seq == END:
                        return
                    if time.monotonic() - asked_db < ENDED_POLL_S:
                        continue
                asked_db = time.monotonic()
                if await read(self.hub.db, has_ended, self.job_id):
                    self._send(Signal.ENDED)  # ended with no end in Redis (expired, lost)
                    return
                if not raw:
                    self._send(Signal.IDLE)
        except (RedisError, SQLAlchemyError) as e:
            log.warning("live feed of job %s stopped: %s", self.job_id, cause(e))
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


class _StreamSlots(KeySlots):
    """The event streams open in this process, refused as TooManyFollowers."""

    def _refusal(self, limit: SlotLimit, owner: str, held: str) -> ProcessBusy:
        return TooManyFollowers(limit.setting, limit.allowed, owner, int(RETRY_AFTER_S))


class EventHub:
    """The live feeds of one API process, one per job that has followers, and the count of
    its open event streams (per key, and in all)."""

    def __init__(self, db: Database, ar: AsyncRedis, settings: Settings) -> None:
        self.db = db
        self.ar = ar
        self.streams = _StreamSlots(
            "event streams open",
            per_key=SlotLimit("sse_max_per_key", settings.sse_max_per_key),
            per_process=SlotLimit("sse_max_per_process", settings.sse_max_per_process),
        )
        self.max_lag = settings.sse_max_lag
        self.feeds: dict[str, _Feed] = {}
        self.lagging = 0  # followers let go as lagging, for /metrics

    @property
    def open(self) -> Counter[str]:
        """Owner id -> its open streams."""
        return self.streams.open

    def admit(self, owner: str) -> None:
        """Count a new stream of `owner`'s, or refuse it (TooManyFollowers). Each admitted
        stream is released once (EventStreamResponse)."""
        self.streams.take(owner)

    def release(self, owner: str) -> None:
        self.streams.release(owner)

    def follow(self, job_id: str, cursor: EntryId) -> Inbox:
        """Live batches from now on (and possibly some from before: the follower skips
        what it has seen). `cursor` starts a new feed: the last entry the stream holds."""
        feed = self.feeds.get(job_id)
        if feed is None:
            feed = self.feeds[job_id] = _Feed(self, job_id, cursor)
        inbox = Inbox(self.max_lag)
        feed.followers.add(inbox)
        return inbox

    def leave(self, job_id: str, q: Inbox) -> None:
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


def cause(e: Exception) -> str:
    """The error without the statement SQLAlchemy quotes with it."""
    return str(e.orig if isinstance(e, DBAPIError) else e)[:300]


def has_ended(s: Session, job_id: str) -> bool:
    return terminal_status(s, job_id) is not None


def terminal_status(s: Session, job_id: str) -> tuple[int, dict[str, Any]] | None:
    job = get_job(s, job_id=job_id)
    if job is None or not JobStatus(job.status).terminal:
        return None
    payload: dict[str, Any] = {"type": "status", "status": job.status}
    if job.error_code:
        payload["error"] = {"code": job.error_code, "message": job.error_message}
    if job.result:
        payload["result"] = job.result
    return job.progress_step, payload

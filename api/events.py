"""Server-Sent Events for one job: step points, epoch ends and status changes, each with
its stream id as the SSE id, so a client that reconnects with Last-Event-ID resumes exactly
where it stopped. What the Redis stream no longer holds is replayed from the database."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis as AsyncRedis

from core.db import Database, JobStatus
from core.store import epoch_metrics, get_job, step_rows
from core.stream import END, EPOCH, STEP, parse_entries, stream_key

log = logging.getLogger("trainq.api")
IDLE_BLOCK_MS = 5000
EVENT_ID = re.compile(r"^\d{1,18}-\d$")
BACKLOG = 256  # live batches a follower may fall behind by before it reads Redis again
KEEP_ALIVE = ": keep-alive\n\n"

Key = tuple[int, int]
Batch = list[tuple[Key, str]]  # (entry key, the SSE text of that entry), in order


def sse(event_id: str, kind: str, data: dict[str, Any]) -> str:
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"


def _key(event_id: str) -> Key:
    step, seq = event_id.split("-")
    return int(step), int(seq)


def _event_id(key: Key) -> str:
    return f"{key[0]}-{key[1]}"


def _batch(raw: Any) -> Batch:
    return [
        (_key(eid), sse(eid, kind, {"type": kind, **data}))
        for eid, kind, data in parse_entries(raw)
    ]


class _Feed:
    """One job's live entries, read once from Redis for every follower in this process:
    with a hundred followers that is one blocking XREAD, one parse and one SSE encoding per
    batch instead of a hundred of each. A follower that falls BACKLOG batches behind is
    dropped from the feed and reads Redis itself until it has caught up."""

    def __init__(self, hub: EventHub, job_id: str, cursor: str) -> None:
        self.hub = hub
        self.job_id = job_id
        self.cursor = cursor
        self.followers: set[asyncio.Queue[Batch | None]] = set()
        self.task = asyncio.create_task(self._run(), name=f"trainq-feed-{job_id}")

    async def _run(self) -> None:
        key = stream_key(self.job_id)
        try:
            while self.followers:
                raw: Any = await self.hub.ar.xread(
                    {key: self.cursor}, count=500, block=IDLE_BLOCK_MS
                )
                if raw:
                    batch = _batch(raw[0][1])
                    self.cursor = _event_id(batch[-1][0])
                    self._send(batch)
                    if batch[-1][0][1] == END:
                        return
                    continue
                ended = await asyncio.to_thread(_terminal_status, self.hub.db, self.job_id)
                if ended is not None:  # ended with no final event left in Redis (expired)
                    step, payload = ended
                    self._send([((step, END), sse(f"{step}-{END}", "status", payload))])
                    return
                self._send([])  # a keep-alive
        except Exception:
            log.exception("live feed of job %s stopped", self.job_id)
        finally:
            if self.hub.feeds.get(self.job_id) is self:
                del self.hub.feeds[self.job_id]
            for q in list(self.followers):
                _offer(q, None)  # the feed is gone: read Redis directly

    def _send(self, batch: Batch) -> None:
        for q in list(self.followers):
            if not _offer(q, batch):
                self.followers.discard(q)


def _offer(q: asyncio.Queue[Batch | None], item: Batch | None) -> bool:
    try:
        q.put_nowait(item)
    except asyncio.QueueFull:
        q.get_nowait()
        q.put_nowait(None)  # too far behind: told to read Redis itself
        return False
    return True


class EventHub:
    """The live feeds of one API process, one per job that has followers."""

    def __init__(self, db: Database, ar: AsyncRedis) -> None:
        self.db = db
        self.ar = ar
        self.feeds: dict[str, _Feed] = {}

    def follow(self, job_id: str, cursor: str) -> asyncio.Queue[Batch | None]:
        """Live batches from now on (and possibly some from before: the follower skips
        what it has seen). `cursor` starts a new feed: the last entry the stream holds."""
        feed = self.feeds.get(job_id)
        if feed is None:
            feed = self.feeds[job_id] = _Feed(self, job_id, cursor)
        q: asyncio.Queue[Batch | None] = asyncio.Queue(BACKLOG)
        feed.followers.add(q)
        return q

    def leave(self, job_id: str, q: asyncio.Queue[Batch | None]) -> None:
        feed = self.feeds.get(job_id)
        if feed is not None:
            feed.followers.discard(q)
            if not feed.followers:
                del self.feeds[job_id]
                feed.task.cancel()


async def event_stream(
    hub: EventHub, db: Database, ar: AsyncRedis, job_id: str, last_event_id: str | None
) -> AsyncIterator[str]:
    cursor = last_event_id if last_event_id and EVENT_ID.match(last_event_id) else "0-0"
    key = stream_key(job_id)
    first: Any = await ar.xrange(key, count=1)
    if not first or _key(parse_entries(first)[0][0]) > (_key(cursor)[0] + 1, STEP):
        async for chunk, replayed in _replay_from_db(db, job_id, cursor):
            yield chunk
            cursor = replayed
        if not await ar.exists(key):
            ended = await asyncio.to_thread(_terminal_status, db, job_id)
            if ended is not None:
                yield sse(f"{ended[0]}-{END}", "status", ended[1])
                return
    while True:
        # Join the live feed first, then read what came before it from Redis: nothing
        # falls between the two, and what both hold is sent once (by entry id).
        top: Any = await ar.xrevrange(key, count=1)
        q = hub.follow(job_id, parse_entries(top)[0][0] if top else "0-0")
        try:
            async for stored in _stored_entries(ar, key, cursor):
                chunk, cursor, done = _unseen(stored, cursor)
                if chunk:
                    yield chunk
                if done:
                    return
            while (live := await q.get()) is not None:
                if not live:
                    yield KEEP_ALIVE
                    continue
                chunk, cursor, done = _unseen(live, cursor)
                if chunk:
                    yield chunk
                if done:
                    return
        finally:
            hub.leave(job_id, q)


async def _stored_entries(ar: AsyncRedis, key: str, cursor: str) -> AsyncIterator[Batch]:
    while True:
        raw: Any = await ar.xrange(key, min=f"({cursor}", max="+", count=500)
        if not raw:
            return
        batch = _batch(raw)
        yield batch
        cursor = _event_id(batch[-1][0])


def _unseen(batch: Batch, cursor: str) -> tuple[str, str, bool]:
    """The SSE text of the entries after `cursor`, the new cursor, and whether the job ended."""
    after = _key(cursor)
    fresh = [(k, text) for k, text in batch if k > after]
    if not fresh:
        return "", cursor, False
    last = fresh[-1][0]
    return "".join(text for _, text in fresh), _event_id(last), last[1] == END


async def _replay_from_db(db: Database, job_id: str, cursor: str) -> AsyncIterator[tuple[str, str]]:
    after_step, after_seq = _key(cursor)
    while True:
        rows = await asyncio.to_thread(_db_page, db, job_id, after_step, 2000)
        if not rows:
            return
        for event_id, kind, data in rows:
            if _key(event_id) <= (after_step, after_seq):
                continue
            cursor = event_id
            yield sse(event_id, kind, {"type": kind, **data}), cursor
        after_step, after_seq = _key(cursor)


def _db_page(
    db: Database, job_id: str, after_step: int, limit: int
) -> list[tuple[str, str, dict[str, Any]]]:
    with db.readers() as s:
        steps = step_rows(s, job_id=job_id, after=after_step, limit=limit)
        if not steps:
            return []
        last = steps[-1]["step"]
        epochs = [e for e in epoch_metrics(s, job_id=job_id) if after_step <= e.step <= last]
        out: list[tuple[str, str, dict[str, Any]]] = [
            (f"{p['step']}-{STEP}", "step", p) for p in steps
        ]
        out += [(f"{e.step}-{EPOCH}", "epoch", _columns(e)) for e in epochs]
    return sorted(out, key=lambda row: _key(row[0]))


def _columns(row: Any) -> dict[str, Any]:
    return {c.key: getattr(row, c.key) for c in row.__table__.columns if c.key != "job_id"}


def _terminal_status(db: Database, job_id: str) -> tuple[int, dict[str, Any]] | None:
    with db.readers() as s:
        job = get_job(s, job_id=job_id)
        if job is None or not JobStatus(job.status).terminal:
            return None
        payload: dict[str, Any] = {"type": "status", "status": job.status}
        if job.error_code:
            payload["error"] = {"code": job.error_code, "message": job.error_message}
        if job.result:
            payload["result"] = job.result
        return job.progress_step, payload

"""Server-Sent Events for one job: step points, epoch ends and status changes, each with
its stream id as the SSE id, so a client that reconnects with Last-Event-ID resumes exactly
where it stopped. What the Redis stream no longer holds is replayed from the database."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from redis.asyncio import Redis as AsyncRedis

from core.db import Database, JobStatus
from core.store import epoch_metrics, get_job, step_metrics
from core.stream import END, EPOCH, STEP, parse_entries, stream_key

IDLE_BLOCK_MS = 5000
EVENT_ID = re.compile(r"^\d{1,18}-\d$")


def sse(event_id: str, kind: str, data: dict[str, Any]) -> str:
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"


def _key(event_id: str) -> tuple[int, int]:
    step, seq = event_id.split("-")
    return int(step), int(seq)


async def event_stream(
    request: Request, db: Database, ar: AsyncRedis, job_id: str, last_event_id: str | None
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
    while not await request.is_disconnected():
        batch: Any = await ar.xread({key: cursor}, count=500, block=IDLE_BLOCK_MS)
        if not batch:
            ended = await asyncio.to_thread(_terminal_status, db, job_id)
            if ended is not None:  # ended with no final event left in Redis (e.g. expired)
                step, payload = ended
                yield sse(f"{step}-{END}", "status", payload)
                return
            yield ": keep-alive\n\n"
            continue
        for cursor, kind, data in parse_entries(batch[0][1]):
            yield sse(cursor, kind, {"type": kind, **data})
            if _key(cursor)[1] == END:
                return


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
        steps = step_metrics(s, job_id=job_id, after=after_step, limit=limit)
        if not steps:
            return []
        last = steps[-1].step
        epochs = [e for e in epoch_metrics(s, job_id=job_id) if after_step <= e.step <= last]
        out: list[tuple[str, str, dict[str, Any]]] = [
            (f"{p.step}-{STEP}", "step", _columns(p)) for p in steps
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

"""The live, bounded per-job event stream in Redis: per-step metrics, epoch ends, status.

One Redis Stream per job with explicit entry ids, so a stream id is also a cursor:
`{step}-0` is the metric point of that step, `{step}-1` the end of an epoch at that step,
`{step}-2` a job starting (or resuming) after that step and `{step}-3` the job ending.
The database keeps the full history; Redis may lose or expire the stream."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

if TYPE_CHECKING:
    from core.train import EpochMetrics, StepMetrics


STEP, EPOCH, START, END = 0, 1, 2, 3
KIND = {STEP: "step", EPOCH: "epoch", START: "status", END: "status"}
FINISHED_TTL_S = 24 * 3600


def stream_key(job_id: str) -> str:
    return f"trainq:job:{job_id}:events"


def cancel_key(job_id: str) -> str:
    return f"trainq:job:{job_id}:cancel"


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: non-finite floats become null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def publish_steps(r: Redis, job_id: str, points: Sequence[StepMetrics], maxlen: int) -> None:
    """One round trip for a block of steps."""
    key = stream_key(job_id)
    pipe = r.pipeline(transaction=False)
    for p in points:
        pipe.xadd(
            key,
            {"data": json.dumps(_finite(asdict(p)))},
            id=f"{p.step}-{STEP}",
            maxlen=maxlen,
            approximate=True,
        )
    pipe.execute()


def publish_epoch(r: Redis, job_id: str, m: EpochMetrics) -> None:
    r.xadd(stream_key(job_id), {"data": json.dumps(_finite(asdict(m)))}, id=f"{m.step}-{EPOCH}")


def publish_status(r: Redis, job_id: str, step: int, payload: dict[str, Any]) -> None:
    """A status change after `step`. On start, entries past `step` left by an earlier attempt
    are removed first, so every step stays in the stream exactly once."""
    key = stream_key(job_id)
    ending = payload.get("status") in ("succeeded", "failed", "canceled")
    if not ending:
        rewind(r, job_id, step)
    seq = END if ending else START
    r.xadd(key, {"data": json.dumps(_finite(payload))}, id=f"{step}-{seq}")
    if ending:
        r.expire(key, FINISHED_TTL_S)


def rewind(r: Redis, job_id: str, step: int) -> None:
    """Drop entries after the end of `step` and let ids restart there."""
    key = stream_key(job_id)
    later: Any = r.xrange(key, min=f"{step}-{START}", max="+")
    if later:
        r.xdel(key, *[entry_id for entry_id, _ in later])
    top: Any = r.xrevrange(key, count=1)
    if later or top:
        r.execute_command("XSETID", key, top[0][0] if top else "0-1")


Entry = tuple[str, str, dict[str, Any]]  # (stream id, kind, data)


def parse_entries(raw: Any) -> list[Entry]:
    """XRANGE/XREAD entries (bytes or str, as the client returns them) -> (id, kind, data)."""
    out = []
    for entry_id, fields in raw or []:
        eid = _text(entry_id)
        data = fields.get(b"data") or fields.get("data")
        out.append((eid, KIND[seq_of(eid)], json.loads(data)))
    return out


def read(r: Redis, job_id: str, after: str | None, count: int) -> list[Entry]:
    """Entries after stream id `after` (exclusive)."""
    start = "-" if after is None else f"({after}"
    raw: Any = r.xrange(stream_key(job_id), min=start, max="+", count=count)
    return parse_entries(raw)


async def aread(ar: AsyncRedis, job_id: str, after: str | None, count: int) -> list[Entry]:
    """`read` with the asyncio client."""
    start = "-" if after is None else f"({after}"
    raw: Any = await ar.xrange(stream_key(job_id), min=start, max="+", count=count)
    return parse_entries(raw)


def latest_step(r: Redis, job_id: str) -> int:
    """The last step the stream has seen (0 if none)."""
    raw: Any = r.xrevrange(stream_key(job_id), count=1)
    return step_of(_text(raw[0][0])) if raw else 0


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def step_of(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


def seq_of(entry_id: str) -> int:
    return int(entry_id.split("-")[1])

"""The live, bounded per-job event stream in Redis: per-step metrics, epoch ends, status.

One Redis Stream per job with explicit entry ids, so a stream id is also a cursor:
`{step}-0` is the metric point of that step, `{step}-1` the end of an epoch at that step,
`{step}-2` a job starting (or resuming) after that step and `{step}-3` the job ending.
Every write goes through one Lua script (core.stream_lua), fenced by attempt; the database
keeps the full history, and Redis may lose or expire the stream. See docs/jobs.md ("The
event stream") and docs/operations.md ("Redis: memory and limits")."""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from enum import Enum
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError

from core.spec import JobStatus
from core.stream_lua import RAISE_FENCE, WRITE

if TYPE_CHECKING:
    from core.train import EpochMetrics, StepMetrics


STEP, EPOCH, START, END = 0, 1, 2, 3
KIND = {STEP: "step", EPOCH: "epoch", START: "status", END: "status"}
LIVE_TTL_S = 7 * 24 * 3600  # rolling: from the last write
# An ended job's stream serves only followers that reconnect; the database holds every
# step, and every ended job's stream would be held this long (Redis's memory, README).
FINISHED_TTL_S = 3600
WRITE_BATCH = 1000  # entries per script call: a long backlog must not block Redis for long
BACKOFF_FIRST_S, BACKOFF_MAX_S = 1.0, 15.0

log = logging.getLogger("trainq.stream")
# The largest step any route names (a signed 32-bit column): far past any run. An entry
# past it is no entry a trainq writer made.
MAX_STEP = 2**31 - 1
_ENTRY_ID = re.compile(r"([0-9]{1,10})-([0-9])")


class InvalidEntryId(ValueError):
    """Text that is not a stream entry id `<step>-<seq>` (a client's Last-Event-ID, say)."""


class EntryId(NamedTuple):
    """A stream entry id, `<step>-<seq>`: the entry of kind `seq` (STEP, EPOCH, START, END)
    at `step`. Ordered as the stream orders its entries; its text is also the SSE `id` a
    follower resumes from. A tuple, so that comparing two costs what comparing ints does."""

    step: int
    seq: int

    def __str__(self) -> str:
        return f"{self.step}-{self.seq}"

    @classmethod
    def parse(cls, text: str) -> EntryId:
        """The id `text` spells; InvalidEntryId for anything else."""
        match = _ENTRY_ID.fullmatch(text)
        if match is None or int(match[1]) > MAX_STEP:
            raise InvalidEntryId(f"{text[:40]!r} is not a stream entry id <step>-<seq>")
        return cls(int(match[1]), int(match[2]))

    @classmethod
    def of_stream(cls, raw: bytes | str) -> EntryId:
        """An id as Redis returned it: always two integers, read as they are. A client's
        id is held to `parse`'s bounds; one in the stream is whatever its writer chose."""
        step, seq = _text(raw).split("-")
        return cls(int(step), int(seq))

    def exclusive(self) -> str:
        """The XRANGE bound that starts after this entry."""
        return f"({self}"


Entry = tuple[str, str, dict[str, Any]]  # (stream id as Redis returned it, kind, data), as read
Pending = tuple[EntryId, str]  # (stream id, JSON data), to write


class Outcome(Enum):
    WRITTEN = "written"  # every entry is in the stream now (added, or there already)
    SUPERSEDED = "superseded"  # a later attempt started: nothing of this one is written
    ENDED = "ended"  # the stream already holds its end: nothing more is written
    UNFENCED = "unfenced"  # no fence: nothing is written until the writer proves it owns the job


# The job row's attempt and status, read from the database when it is asked (None: no row).
RowState = Callable[[], tuple[int, JobStatus] | None]


def stream_key(job_id: str) -> str:
    return f"trainq:job:{job_id}:events"


def attempt_key(job_id: str) -> str:
    return f"trainq:job:{job_id}:attempt"


def cancel_key(job_id: str) -> str:
    return f"trainq:job:{job_id}:cancel"


def job_keys(job_id: str) -> list[str]:
    """Every key a job has in Redis besides its queue entries (RQ's own)."""
    return [stream_key(job_id), attempt_key(job_id), cancel_key(job_id)]


def forget_job(r: Redis, job_id: str) -> None:
    """Delete the job's keys (its job was deleted)."""
    r.delete(*job_keys(job_id))


def ask_to_stop(r: Redis, job_id: str) -> None:
    """Tell a running attempt to stop (it polls this between steps)."""
    r.set(cancel_key(job_id), 1, ex=LIVE_TTL_S)


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: non-finite floats become null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _pending(step: int, seq: int, data: dict[str, Any]) -> Pending:
    return EntryId(step, seq), json.dumps(_finite(data))


def step_entries(points: Iterable[StepMetrics]) -> list[Pending]:
    return [_pending(p.step, STEP, asdict(p)) for p in points]


def epoch_entry(m: EpochMetrics) -> Pending:
    """The epoch's scalar figures; its class figures (a matrix that grows with the classes
    squared) are read from the database (GET /jobs/{id}/confusion)."""
    fields = asdict(m)
    fields.pop("class_metrics", None)
    return _pending(m.step, EPOCH, fields)


def status_entry(step: int, payload: dict[str, Any]) -> Pending:
    """A terminal status is the job's end; any other starts (or resumes) it after `step`."""
    ending = JobStatus(payload["status"]).terminal
    return _pending(step, END if ending else START, payload)


def write(
    r: Redis,
    job_id: str,
    attempt: int,
    entries: Sequence[Pending],
    maxlen: int = 0,
    *,
    vouched: bool = True,
) -> Outcome:
    """One atomic round trip: `entries` (in id order) as attempt `attempt` writes them.
    `vouched`: the caller holds the database's word for this attempt (it just claimed the
    job, or the job just ended there), so a missing fence counts as none; otherwise a
    missing fence refuses the write (UNFENCED)."""
    script = r.register_script(WRITE)
    ttls = [LIVE_TTL_S * 1000, FINISHED_TTL_S * 1000]
    args: list[str | int] = [attempt, maxlen, *ttls, 1 if vouched else 0]
    for entry_id, data in entries:
        args += [str(entry_id), data]
    added: Any = script(keys=job_keys(job_id), args=args)
    codes = {-1: Outcome.SUPERSEDED, -2: Outcome.ENDED, -3: Outcome.UNFENCED}
    return codes.get(int(added), Outcome.WRITTEN)


def raise_fence(r: Redis, job_id: str, attempt: int) -> int:
    """Set the fence to `attempt` unless it is higher already; the fence as it is now."""
    script = r.register_script(RAISE_FENCE)
    now: Any = script(keys=[attempt_key(job_id)], args=[attempt, LIVE_TTL_S * 1000])
    return int(now)


def publish_steps(
    r: Redis, job_id: str, points: Sequence[StepMetrics], maxlen: int, *, attempt: int
) -> Outcome:
    return write(r, job_id, attempt, step_entries(points), maxlen)


def publish_epoch(r: Redis, job_id: str, m: EpochMetrics, *, attempt: int) -> Outcome:
    return write(r, job_id, attempt, [epoch_entry(m)])


def publish_status(
    r: Redis, job_id: str, step: int, payload: dict[str, Any], *, attempt: int
) -> Outcome:
    """A status change after `step`, vouched for by the caller (a start just claimed, an end
    just decided in the database). A start removes what earlier attempts wrote past
    `step`, so every step stays in the stream exactly once; an end is keyed at the
    stream's last step if that is higher, and closes the stream."""
    return write(r, job_id, attempt, [status_entry(step, payload)])


class Publisher:
    """One attempt's writes to its job's stream, in order, from one queue: step blocks,
    epoch ends and status changes alike, so none overtakes another and none is lost
    while Redis is away. A failed write keeps the queue and backs off (Redis is not asked
    again for 1 s, doubling to 15 s), so an outage costs the training loop no time. The
    queue is bounded by the stream's own MAXLEN: older points would be trimmed anyway,
    and the database has every step.

    Its writes never vouch for themselves: where the fence is missing, `row` (the job row,
    read from the database) must show this attempt running, or ended with its end still
    to send, before the fence is raised to it again; otherwise the attempt is superseded."""

    def __init__(self, r: Redis, job_id: str, attempt: int, maxlen: int, row: RowState) -> None:
        self.r = r
        self.job_id = job_id
        self.attempt = attempt
        self.maxlen = maxlen
        self.row = row
        self.waiting: deque[Pending] = deque()
        self.stopped: Outcome | None = None  # superseded or ended: nothing more to write
        self.retry_at = 0.0
        self.backoff_s = 0.0

    def add(self, entries: Iterable[Pending]) -> None:
        if self.stopped is None:
            self.waiting.extend(entries)
            self._bound()

    def _bound(self) -> None:
        excess = len(self.waiting) - self.maxlen
        if excess <= 0:
            return
        start = self.waiting.popleft() if self.waiting[0][0].seq == START else None
        for _ in range(excess):
            self.waiting.popleft()
        if start is not None:  # the start rewinds what an earlier attempt left: it stays
            self.waiting.appendleft(start)

    def available(self) -> bool:
        """Whether Redis may be asked now (it did not fail a moment ago)."""
        return time.monotonic() >= self.retry_at

    def flush(self, *, force: bool = False) -> bool:
        """Send what waits, unless Redis failed a moment ago (`force`: the last write of a
        run, tried anyway). True if Redis took it all."""
        if self.stopped is not None or not (force or self.available()):
            return False
        try:
            while self.waiting:
                batch = list(islice(self.waiting, WRITE_BATCH))
                outcome = self._write(batch)
                if outcome is not Outcome.WRITTEN:
                    self._stop(outcome)
                    return False
                for _ in batch:
                    self.waiting.popleft()
        except (RedisError, _Unproven) as e:
            self.failed(e)
            return False
        self.backoff_s = 0.0
        return True

    def _write(self, batch: list[Pending]) -> Outcome:
        outcome = write(self.r, self.job_id, self.attempt, batch, self.maxlen, vouched=False)
        if outcome is not Outcome.UNFENCED:
            return outcome
        if not self._owns():
            return Outcome.SUPERSEDED
        raise_fence(self.r, self.job_id, self.attempt)
        outcome = write(self.r, self.job_id, self.attempt, batch, self.maxlen, vouched=False)
        if outcome is Outcome.UNFENCED:  # emptied again meanwhile: try later, proving again
            raise _Unproven("the fence went missing again")
        return outcome

    def _owns(self) -> bool:
        """Whether the database says this attempt owns its job (for an end: that the job
        ended with this attempt's end still to send)."""
        try:
            state = self.row()
        except Exception as e:  # whatever the database raised: it could not tell, yet
            raise _Unproven(f"the database could not say who owns the job: {e}") from e
        if state is None or state[0] != self.attempt:
            return False
        status = state[1]
        ending = any(entry_id.seq == END for entry_id, _ in self.waiting)
        return status is JobStatus.running or (status.terminal and ending)

    def failed(self, e: Exception) -> None:
        """Redis failed a call (or ownership could not be proved): leave it alone a while."""
        self.backoff_s = min(max(self.backoff_s * 2, BACKOFF_FIRST_S), BACKOFF_MAX_S)
        self.retry_at = time.monotonic() + self.backoff_s
        log.warning(
            "job %s: stream not written (%s); %d entries wait, next try in %.0f s",
            self.job_id,
            e,
            len(self.waiting),
            self.backoff_s,
        )

    def _stop(self, outcome: Outcome) -> None:
        self.stopped = outcome
        self.waiting.clear()
        log.warning(
            "job %s: attempt %d stops publishing: the stream is %s",
            self.job_id,
            self.attempt,
            outcome.value,
        )

    def cancel_requested(self) -> bool:
        """The API's cancel flag, under the same back-off (the database's flag, read with
        the heartbeat, covers an outage)."""
        if not self.available():
            return False
        try:
            return bool(self.r.exists(cancel_key(self.job_id)))
        except RedisError as e:
            self.failed(e)
            return False


class _Unproven(Exception):
    """The fence is missing and the database could not (yet) say who owns the job."""


def parse_entries(raw: Any) -> list[Entry]:
    """XRANGE/XREAD entries (bytes or str, as the client returns them) -> (id, kind, data).
    An entry no trainq writer makes (a kind it does not write, a step past MAX_STEP, data
    that is no JSON object) is skipped with a log line: whoever wrote it to Redis must not
    fail the routes and followers that read the stream."""
    out = []
    for entry_id, fields in raw or []:
        eid = _text(entry_id)
        key = EntryId.of_stream(eid)
        try:
            data = json.loads(fields.get(b"data") or fields.get("data"))
        except (TypeError, ValueError):
            data = None
        if key.seq not in KIND or key.step > MAX_STEP or not isinstance(data, dict):
            log.warning("stream entry %s is none a trainq writer makes: skipped", eid[:40])
            continue
        out.append((eid, KIND[key.seq], data))
    return out


def read(r: Redis, job_id: str, after: EntryId | None, count: int) -> list[Entry]:
    """Entries after `after` (from the first with None)."""
    start = "-" if after is None else after.exclusive()
    raw: Any = r.xrange(stream_key(job_id), min=start, max="+", count=count)
    return parse_entries(raw)


async def aread(ar: AsyncRedis, job_id: str, after: EntryId | None, count: int) -> list[Entry]:
    """`read` with the asyncio client."""
    start = "-" if after is None else after.exclusive()
    raw: Any = await ar.xrange(stream_key(job_id), min=start, max="+", count=count)
    return parse_entries(raw)


def latest_step(r: Redis, job_id: str) -> int:
    """The last step the stream has seen (0 if none)."""
    raw: Any = r.xrevrange(stream_key(job_id), count=1)
    return EntryId.of_stream(raw[0][0]).step if raw else 0


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

"""Fair share: which waiting entry a free worker takes off the queue.

The one RQ queue stays the carrier (core.queue's contract is unchanged); only the order in
which workers take its entries changes. A free worker, holding a short lock that all
workers of the queue share, reads what waits (the queue list) and what is taken but not yet
ended (RQ's intermediate list and started registry, and the running rows), and takes:

1. first, any entry that cannot compete: junk, or one whose row no longer waits under it
   (ended, running elsewhere, re-enqueued under another entry). The worker's usual path
   drops, refuses or skips it at once, as it always did;
2. then the entries of the owner with the fewest jobs running (ties: the owner whose last
   take is oldest, then the one whose oldest waiting job is oldest), leaving out owners at
   their `max_running`; within an owner, `jobs.priority` (high first), then age.

A job has a row (the API's, or the reconciler's) or is an entry that another service put
straight onto the queue: that one competes as its payload's owner, with its spec's
priority, until the work horse gives it its row. Admin jobs (owner None) are one more owner.

The take is one Redis script, LREM from the queue and RPUSH onto RQ's intermediate list,
so two workers never take the same entry, and a worker killed after it is in the state RQ's
own dequeue (BLMOVE) leaves: the entry sits in the intermediate list. RQ's clean-up would
fail it only ten to twenty minutes later (two of its maintenance passes), and all that time
it would count as running for its owner, whose slot it holds. So each take is also recorded
with its time, and a take that no work horse started within TAKE_GRACE_MS (its taker
killed, or the take's reply lost on the wire) goes back to the head of the queue at the next
choice. Should its taker start it after all, the job's claim lets one attempt run."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from redis import Redis
from rq import Queue
from rq.job import Job as RQJob
from rq.utils import utcparse
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import Database, Job
from core.queue import MAX_OWNER_CHARS, MAX_PAYLOAD_BYTES
from core.quotas import in_force, overrides, spans_by_owner, trained_s
from core.spec import JobStatus, Priority
from worker.entry_checks import UnreadableEntry, inflate, is_uuid, read_entry

Owner = str | None
log = logging.getLogger("trainq.worker")
LOCK_TTL_MS = 10_000  # far above one choice (a few reads); a dead holder frees it this soon
LOCK_WAIT_S = 0.02
LOCK_LOST = -1  # the take script's answer when this worker no longer holds the lock
TURNS_TTL_MS = 24 * 3600 * 1000  # owners' last turns: forgotten after a day without a take
ADMINS = ""  # the admins' field in the turns hash: no owner id is empty (core.queue)
TAKE_GRACE_MS = 30_000  # a take starts within a second (a fork); past this its taker is gone
ROWS_PER_QUERY = 500  # ids in one IN (...): within SQLite's bound on parameters
# Direct entries' payloads, read once each: an entry's hash does not change while it waits,
# and a queue of thousands of direct entries would otherwise cost a script call for each,
# at every choice, under the lock.
PAYLOAD_CACHE = 100_000
# New direct entries read in one choice, head first: one that is not read yet waits for a
# later choice, and a flood of them keeps one choice (and the lock) short.
NEW_PAYLOADS_PER_CHOICE = 500

# The take: the entry leaves the queue and joins RQ's intermediate list in one step (as
# RQ's own BLMOVE does), or nothing happens when it is no longer on the queue. The take's
# time (Redis's clock, ms) is recorded in KEYS[4] (return_stranded). When the entry
# competes (ARGV[3] is 1; ARGV[4] names its owner), the owner's turn is recorded too: a
# number that grows with each take, in a hash of one field per owner.
_TAKE = """
if redis.call('GET', KEYS[5]) ~= ARGV[5] then return -1 end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
local now = redis.call('TIME')
redis.call('HSET', KEYS[4], ARGV[1], now[1] * 1000 + math.floor(now[2] / 1000))
redis.call('PEXPIRE', KEYS[4], ARGV[2])
if ARGV[3] == '1' then
  local turn = redis.call('HINCRBY', KEYS[3], '#turns', 1)
  redis.call('HSET', KEYS[3], ARGV[4], turn)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return 1
"""
# A take not started within the grace (ARGV[2], ms) goes back to the queue's head; a take
# that left the intermediate list (a horse started it) is forgotten. 1: returned.
_RETURN = """
local at = redis.call('HGET', KEYS[3], ARGV[1])
local now = redis.call('TIME')
if redis.call('LPOS', KEYS[2], ARGV[1]) == false then
  redis.call('HDEL', KEYS[3], ARGV[1])
  return 0
end
if not at or tonumber(at) + tonumber(ARGV[2]) > now[1] * 1000 + math.floor(now[2] / 1000) then
  return 0
end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('LREM', KEYS[2], 1, ARGV[1])
redis.call('LPUSH', KEYS[1], ARGV[1])
return 1
"""
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Waiting:
    """An entry on the queue that competes for a worker."""

    entry: str
    owner: Owner
    priority: int  # core.spec.Priority.rank: higher goes first within the owner
    since: dt.datetime  # the job's creation (a direct entry's enqueue), in UTC


@dataclass(frozen=True)
class Shares:
    """What each owner runs now (job ids), may run at once (None: no limit), and when a
    worker last took one of its jobs (a number that grows with each take; 0: never); and the
    owners whose training hours of the trailing day are used up (none of theirs starts until
    some age out)."""

    running: Mapping[Owner, frozenset[str]]
    max_running: Mapping[Owner, int | None]
    last_turn: Mapping[Owner, int]
    out_of_hours: frozenset[Owner] = frozenset()  # at max_train_hours_per_day

    def count(self, owner: Owner) -> int:
        return len(self.running.get(owner, ()))

    def at_limit(self, owner: Owner) -> bool:
        if owner in self.out_of_hours:
            return True
        limit = self.max_running.get(owner)
        return limit is not None and self.count(owner) >= limit


def fair_order(waiting: Iterable[Waiting], shares: Shares) -> list[Waiting]:
    """The entries a free worker should try, best first: owners by fewest running, then by
    whose turn came longest ago, then by their oldest waiting job; an owner's own by
    priority, then age. Owners at their limit are left out: their jobs wait.

    The turn matters where running counts tie, which on a busy pool is every time a worker
    frees up: by the oldest job alone, the owner with a long backlog would win every tie,
    and one worker would serve its owners first in, first out."""
    by_owner: dict[Owner, list[Waiting]] = defaultdict(list)
    for w in waiting:
        by_owner[w.owner].append(w)
    owners = [o for o in by_owner if not shares.at_limit(o)]
    owners.sort(
        key=lambda o: (
            shares.count(o),
            shares.last_turn.get(o, 0),
            min(w.since for w in by_owner[o]),
        )
    )
    return [
        w
        for o in owners
        for w in sorted(by_owner[o], key=lambda w: (-w.priority, w.since, w.entry))
    ]


class Row(NamedTuple):
    id: str
    owner: Owner
    status: str
    queue_entry: str | None
    priority: int
    created_at: dt.datetime


def job_id_of(entry: bytes) -> str | None:
    """The trainq job an entry id names by the contract (`<uuid>` or `<uuid>-<suffix>`), or
    None for an id that names none (the worker's usual path drops or refuses it)."""
    try:
        text = entry.decode()
    except UnicodeDecodeError:
        return None
    head = text[:36]
    if is_uuid(head) and (len(text) == 36 or text[36] == "-"):
        return head
    return None


@dataclass(frozen=True)
class Payload:
    """The little of a direct entry that fair share reads: whose it is, and its priority."""

    owner: Owner
    priority: int
    since: dt.datetime


def read_payload(r: Redis, entry: str) -> Payload | None:
    """A direct entry's owner, priority and enqueue time, read within the worker's bounds
    (worker.entry_checks); None when it cannot be read or breaks the contract's shape."""
    try:
        fields = read_entry(r, RQJob.redis_job_namespace_prefix + entry)
    except UnreadableEntry:
        return None
    try:
        _, _, _, kwargs = json.loads(inflate(fields.get(b"data", b""), MAX_PAYLOAD_BYTES))
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(kwargs, dict) or not isinstance(kwargs.get("spec"), dict):
        return None
    owner = kwargs.get("owner")
    if owner is not None and not (isinstance(owner, str) and 1 <= len(owner) <= MAX_OWNER_CHARS):
        return None
    return Payload(owner, _rank(kwargs["spec"].get("priority")), _enqueued_at(fields))


def _rank(value: Any) -> int:
    try:
        return Priority(value).rank if value is not None else Priority.normal.rank
    except ValueError:
        return Priority.normal.rank  # the admission refuses the spec; it competes as normal


def _enqueued_at(fields: Mapping[bytes, bytes]) -> dt.datetime:
    try:
        return utcparse(fields[b"enqueued_at"].decode())
    except (KeyError, UnicodeDecodeError, ValueError):
        return dt.datetime.now(dt.UTC)


def _turn(raw: bytes | str | None) -> int:
    """An owner's last turn; 0 (never) for none, or for what no take wrote."""
    try:
        return int(raw) if raw is not None and len(raw) <= 20 else 0
    except ValueError:
        return 0


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


class FairShare:
    """The choice of a free worker of one queue (see the module's docstring)."""

    def __init__(self, r: Redis, db: Database, settings: Settings, queue: Queue) -> None:
        self.r, self.db, self.settings, self.queue = r, db, settings, queue
        self.lock_key = f"{queue.key}:fair-share-lock"
        self.turns_key = f"{queue.key}:fair-share-turns"
        self.takes_key = f"{queue.key}:fair-share-takes"  # entry -> when it was taken (ms)
        self.take_script = r.register_script(_TAKE)
        self.return_script = r.register_script(_RETURN)
        self.unlock_script = r.register_script(_UNLOCK)
        self._payloads: dict[str, Payload | None] = {}
        self._reads_left = NEW_PAYLOADS_PER_CHOICE

    def take(self) -> bytes | None:
        """The entry this worker took (now in RQ's intermediate list), or None when nothing
        on the queue may start now."""
        keys = [
            self.queue.key,
            self.queue.intermediate_queue_key,
            self.turns_key,
            self.takes_key,
            self.lock_key,
        ]
        with self._lock() as token:
            self.return_stranded()
            for entry, owner in self.plan():
                turn: list[str | int] = [0, ""]
                if owner is not False:
                    turn = [1, ADMINS if owner is None else owner]
                taken = self.take_script(keys=keys, args=[entry, TURNS_TTL_MS, *turn, token])
                if taken == LOCK_LOST:
                    # The choice outlasted the lock (a slow database): another worker may be
                    # choosing from the same counts, so this one takes nothing and looks again.
                    log.warning("fair share: the choice took longer than the lock; choosing again")
                    return None
                if taken:
                    return entry
        return None

    def return_stranded(self) -> list[bytes]:
        """Takes that no work horse started within TAKE_GRACE_MS, put back at the queue's
        head (see the module's docstring); records of takes that started, forgotten."""
        recorded: list[bytes] = self.r.hkeys(self.takes_key)  # type: ignore[assignment]
        if not recorded:
            return []
        members: list[bytes] = self.r.zrange(self.queue.started_job_registry.key, 0, -1)  # type: ignore[assignment]
        started = {m.split(b":", 1)[0] for m in members}
        keys = [self.queue.key, self.queue.intermediate_queue_key, self.takes_key]
        returned = []
        for entry in recorded:
            # Its execution is registered: RQ's own clean-up judges its worker.
            if entry not in started and self.return_script(keys=keys, args=[entry, TAKE_GRACE_MS]):
                returned.append(entry)
        return returned

    def plan(self) -> list[tuple[bytes, Owner | Literal[False]]]:
        """The entries to try, best first, each with its owner (False: it does not compete)."""
        self._reads_left = NEW_PAYLOADS_PER_CHOICE
        listed = _unique(self._list(self.queue.key))
        started: list[bytes] = self.r.zrange(self.queue.started_job_registry.key, 0, -1)  # type: ignore[assignment]
        taken = _unique(
            [
                *self._list(self.queue.intermediate_queue_key),
                *(m.split(b":", 1)[0] for m in started),  # members: <job id>:<execution id>
            ]
        )
        ids = {e: job_id_of(e) for e in [*listed, *taken]}
        with self.db.reader() as s:
            rows = _rows(s, {i for i in ids.values() if i is not None})
            running = _running(s)
            self._count_taken(running, taken, ids, rows)  # first: they always count
            first, waiting = self._waiting(listed, ids, rows)
            owners = {w.owner for w in waiting}
            limits, out_of_hours = self._limits(s, owners)
        self._forget_payloads(listed, taken)
        shares = Shares(
            {o: frozenset(j) for o, j in running.items()},
            limits,
            self._turns(owners),
            out_of_hours,
        )
        ordered = [(w.entry.encode(), w.owner) for w in fair_order(waiting, shares)]
        return [*((e, False) for e in first), *ordered]

    def _limits(
        self, s: Session, owners: set[Owner]
    ) -> tuple[dict[Owner, int | None], frozenset[Owner]]:
        """Each owner's max_running, and the owners past max_train_hours_per_day: from one
        read of the overrides (not a query an owner), and the trailing day's runs of only
        the owners with an hours limit. Admins (None) have no limits."""
        found = overrides(s)
        limits = {o: in_force(self.settings, found.get(o)) for o in owners if o is not None}
        hours = {o: lim.max_train_hours_per_day for o, lim in limits.items()}
        capped = sorted(o for o, h in hours.items() if h is not None)
        spans = spans_by_owner(s, capped) if capped else {}
        out = {o for o in capped if trained_s(spans.get(o, [])) >= (hours[o] or 0) * 3600}
        max_running: dict[Owner, int | None] = {o: lim.max_running for o, lim in limits.items()}
        return {None: None, **max_running}, frozenset(out)

    def _payload(self, entry: str) -> Payload | Literal[False] | None:
        """The entry's payload (None: unreadable), or False when this choice has read its
        share of new entries already."""
        if entry not in self._payloads:
            if self._reads_left <= 0:
                return False
            self._reads_left -= 1
            self._payloads[entry] = read_payload(self.r, entry)
        return self._payloads[entry]

    def _forget_payloads(self, listed: Sequence[bytes], taken: Sequence[bytes]) -> None:
        """Keep only the payloads of entries still waiting or taken, and never too many."""
        if len(self._payloads) <= PAYLOAD_CACHE // 2:
            return
        live = {e.decode(errors="replace") for e in [*listed, *taken]}
        self._payloads = {e: p for e, p in self._payloads.items() if e in live}
        if len(self._payloads) > PAYLOAD_CACHE:
            self._payloads.clear()

    def _turns(self, owners: set[Owner]) -> dict[Owner, int]:
        listed = sorted(owners, key=lambda o: o or "")
        fields = [ADMINS if o is None else o for o in listed]
        values = self.r.hmget(self.turns_key, fields) if fields else []
        return {o: _turn(v) for o, v in zip(listed, values, strict=True)}

    def _list(self, key: str) -> list[bytes]:
        return self.r.lrange(key, 0, -1)  # type: ignore[return-value]

    def _waiting(
        self, listed: Sequence[bytes], ids: Mapping[bytes, str | None], rows: Mapping[str, Row]
    ) -> tuple[list[bytes], list[Waiting]]:
        """The listed entries that cannot compete (taken first), and those that do."""
        first: list[bytes] = []
        waiting: list[Waiting] = []
        for raw in listed:
            job_id = ids[raw]
            if job_id is None:
                first.append(raw)
                continue
            entry = raw.decode()
            row = rows.get(job_id)
            if row is None:
                payload = self._payload(entry)
                if payload is False:
                    continue  # read in a later choice
                if payload is None:
                    first.append(raw)
                else:
                    waiting.append(Waiting(entry, payload.owner, payload.priority, payload.since))
            elif _waits_under(row, entry):
                waiting.append(Waiting(entry, row.owner, row.priority, _utc(row.created_at)))
            else:
                first.append(raw)
        return first, waiting

    def _count_taken(
        self,
        running: dict[Owner, set[str]],
        taken: Sequence[bytes],
        ids: Mapping[bytes, str | None],
        rows: Mapping[str, Row],
    ) -> None:
        """Entries a worker took whose job has not been claimed yet run already, as far as
        shares go: otherwise two free workers could start one owner past its limit."""
        for raw in taken:
            job_id = ids[raw]
            if job_id is None:
                continue
            row = rows.get(job_id)
            if row is not None:
                if _waits_under(row, raw.decode()):
                    running[row.owner].add(job_id)
                continue
            payload = self._payload(raw.decode())
            if payload:
                running[payload.owner].add(job_id)

    def wait(self, seconds: int) -> None:
        """Until something may have changed, at most `seconds`. A fresh entry on an empty
        queue ends the wait at once (a BLMOVE of the queue onto its own head moves nothing);
        a queue that holds only jobs waiting for their owner's slot is looked at again after
        `seconds`, since a slot frees when a job ends, which no list shows."""
        if self.r.llen(self.queue.key) == 0:
            self.r.blmove(self.queue.key, self.queue.key, seconds, "LEFT", "LEFT")
        else:
            time.sleep(seconds)

    @contextmanager
    def _lock(self) -> Iterator[str]:
        """One worker of the queue chooses at a time, so that each sees the others' takes;
        its token fences the take (a choice that outlasts the TTL takes nothing)."""
        token = uuid.uuid4().hex
        while not self.r.set(self.lock_key, token, nx=True, px=LOCK_TTL_MS):
            time.sleep(LOCK_WAIT_S)
        try:
            yield token
        finally:
            self.unlock_script(keys=[self.lock_key], args=[token])


def _unique(items: Iterable[bytes]) -> list[bytes]:
    return list(dict.fromkeys(items))


def _waits_under(row: Row, entry: str) -> bool:
    """Whether the row is queued and this entry is the one its claim accepts
    (core.store.claim_job)."""
    if row.status != JobStatus.queued:
        return False
    return row.queue_entry == entry or (row.queue_entry is None and entry == row.id)


def _rows(s: Session, job_ids: set[str]) -> dict[str, Row]:
    ordered = sorted(job_ids)
    out: dict[str, Row] = {}
    for i in range(0, len(ordered), ROWS_PER_QUERY):
        chunk = ordered[i : i + ROWS_PER_QUERY]
        q = select(
            Job.id, Job.owner, Job.status, Job.queue_entry, Job.priority, Job.created_at
        ).where(Job.id.in_(chunk))
        out.update((row.id, Row(*row)) for row in s.execute(q))
    return out


def _running(s: Session) -> dict[Owner, set[str]]:
    running: dict[Owner, set[str]] = defaultdict(set)
    for job_id, owner in s.execute(
        select(Job.id, Job.owner).where(Job.status == JobStatus.running)
    ):
        running[owner].add(job_id)
    return running

"""Fair share: which waiting entry a free worker takes off the one RQ queue, in the order of
worker.fair_share_order, taken in one Redis script under a lock all the queue's workers
share; a take no work horse started within TAKE_GRACE_MS goes back to the queue's head.
See docs/quotas.md."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Literal

from redis import Redis
from rq import Queue
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import Database
from core.queue import job_id_of
from core.quotas import in_force, overrides, spans_by_owner, trained_s
from worker.fair_share_order import Owner, Shares, Waiting, fair_order
from worker.fair_share_reads import (
    Payload,
    Row,
    job_rows,
    read_payload,
    running_jobs,
    waits_under,
)

log = logging.getLogger("trainq.worker")
LOCK_TTL_MS = 10_000  # far above one choice (a few reads); a dead holder frees it this soon
LOCK_WAIT_S = 0.02
LOCK_LOST = -1  # the take script's answer when this worker no longer holds the lock
TURNS_TTL_MS = 24 * 3600 * 1000  # owners' last turns: forgotten after a day without a take
ADMINS = ""  # the admins' field in the turns hash: no owner id is empty (core.queue)
TAKE_GRACE_MS = 30_000  # a take starts within a second (a fork); past this its taker is gone
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


def _turn(raw: bytes | str | None) -> int:
    """An owner's last turn; 0 (never) for none, or for what no take wrote."""
    try:
        return int(raw) if raw is not None and len(raw) <= 20 else 0
    except ValueError:
        return 0


class FairShare:
    """The choice of a free worker of one queue (docs/quotas.md)."""

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
        head (a killed taker's: docs/quotas.md); records of takes that started, forgotten."""
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
            rows = job_rows(s, {i for i in ids.values() if i is not None})
            running = running_jobs(s)
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
            elif waits_under(row, entry):
                waiting.append(Waiting(entry, row.owner, row.priority, row.created_at))
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
                if waits_under(row, raw.decode()):
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

"""What the /sweeps routes do: a sweep checked against its data set, created once per
Idempotency-Key with its first trials queued, canceled, and followed (one database read a
sweep per second, however many follow it). See docs/sweeps.md."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Response
from fastapi.encoders import jsonable_encoder
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.orm import Session

from api.access import Starts, check_pretrained, check_start, spec_images
from api.auth import Caller
from api.cancels import announce_cancel, canceled
from api.reads import read
from api.schemas import SweepOut
from api.services.idempotency import answer_again, create_once
from core.config import Settings
from core.db import Database, Job, Sweep
from core.errors import AlreadyEnded, InvalidRequest, NotFound
from core.labels import Labels, LabelsPatch
from core.spec import user_dataset_id
from core.store import spec_hash
from core.store.idempotency import by_idempotency_key
from core.store.labels import relabel_sweep
from core.store.sweeps import SweepStatus, get_sweep
from core.sweeps import trials
from core.sweeps.bounds import bound_problems
from core.sweeps.spec import SweepSpec

log = logging.getLogger("trainq.api")
EVENT_POLL_S = 1.0
KEEPALIVE_S = 15.0


def visible_sweep(session: Session, caller: Caller, sweep_id: uuid.UUID | str) -> Sweep:
    """The sweep, if this caller may see it; NotFound otherwise (another's reads as missing)."""
    sweep = get_sweep(session, sweep_id=str(sweep_id))
    if sweep is None or not caller.can_see(sweep.owner):
        raise NotFound(f"no sweep {sweep_id}")
    return sweep


def check_bounds(session: Session, caller: Caller, spec: SweepSpec) -> None:
    """InvalidRequest (422) if the base's uploaded data set is not the caller's to see, its
    init_from not the caller's own job, its pretrained weights not installed, or a trial the
    space allows would not fit its images or could not start from its init_from
    (api.access.Starts)."""
    shape, classes = spec_images(session, caller, spec.base, ("body", "base"))
    starts = Starts(session, caller, shape)
    check_start(starts, spec.base, ("body", "base"))
    check_pretrained(spec.base, ("body", "base"))
    images = None if user_dataset_id(spec.base.dataset) is None else (shape, classes)
    problems = bound_problems(spec, images, starts.problem)
    if problems:
        raise InvalidRequest(problems)


def create(
    db: Database,
    session: Session,
    r: Redis,
    settings: Settings,
    caller: Caller,
    spec: SweepSpec,
    labels: Labels,
    idempotency_key: str | None,
) -> tuple[Sweep, Response | None]:
    """The new sweep with its first trials queued; or, for an Idempotency-Key used before,
    that sweep (its labels as they are) and the answer to send again
    (api.services.idempotency)."""

    def find() -> Sweep | None:
        key = idempotency_key or ""
        return by_idempotency_key(session, Sweep, owner=caller.owner, key=key)

    first: list[Job] = []

    def make() -> Sweep:
        sweep, made = trials.create(
            session,
            settings,
            spec=spec,
            owner=caller.owner,
            quota_owner=caller.quota_owner,
            idempotency_key=idempotency_key,
            labels=labels,
        )
        session.commit()
        first.extend(made)
        return sweep

    sweep, created = create_once(session, idempotency_key, find, make)
    if not created:
        return sweep, _again(session, sweep, spec)
    _queue_first(db, session, r, settings, sweep, first)
    return sweep, None


def _again(session: Session, found: Sweep, spec: SweepSpec) -> Response:
    def body() -> Any:
        return jsonable_encoder(SweepOut.model_validate(trials.report(session, found)))

    body_hash = spec_hash(spec.model_dump(mode="json"))
    return answer_again(found, body_hash, body, what="sweep", noun="sweep")


def _queue_first(
    db: Database, session: Session, r: Redis, settings: Settings, sweep: Sweep, first: list[Job]
) -> None:
    """Enqueue the trials made with the sweep; the rest of `parallel`, a few at a time."""
    trials.enqueue(r, settings, first)
    if len(first) == trials.ASKS_PER_TRANSACTION:
        session.close()
        try:
            trials.advance(db, r, settings, sweep_id=sweep.id)
        except Exception as e:  # the sweep stands; the reconciler's pass makes the rest
            log.warning("sweep %s: its first trials are left to the reconciler: %s", sweep.id, e)


def relabel(session: Session, sweep: Sweep, patch: LabelsPatch) -> Sweep:
    """The sweep renamed, tagged or annotated as `patch` says, committed."""
    changed = relabel_sweep(session, sweep_id=sweep.id, patch=patch)
    if changed is None:  # deleted since it was looked up
        raise NotFound(f"no sweep {sweep.id}")
    session.commit()
    return changed


def cancel(session: Session, r: Redis, sweep: Sweep) -> None:
    """No more trials; queued ones end canceled, running ones are asked to stop. AlreadyEnded
    if the sweep has ended. Committed before Redis is told: workers also read the flag with
    their heartbeat."""
    moved = trials.cancel(session, sweep_id=sweep.id)
    if moved is None:
        raise AlreadyEnded(f"sweep {sweep.id} already ended ({sweep.status})")
    notes = [canceled(session, job, outcome) for job, outcome in moved]
    session.refresh(sweep)
    session.commit()
    for note in notes:
        try:
            announce_cancel(r, note)
        except RedisError as e:
            log.warning("job %s: canceled, but Redis was not told: %s", note.job_id, e)


class SweepReports:
    """The reports that one API process's followers of sweeps are sent: one database read a
    sweep per EVENT_POLL_S, however many follow it."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._cache: dict[str, tuple[float, str | None]] = {}  # sweep -> (when, report)
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, sweep_id: str) -> str | None:
        """The sweep's report as JSON text, at most EVENT_POLL_S old; None once it is gone."""
        lock = self._locks.setdefault(sweep_id, asyncio.Lock())
        async with lock:
            hit = self._cache.get(sweep_id)
            if hit is not None and time.monotonic() - hit[0] < EVENT_POLL_S:
                return hit[1]
            body = await read(self._db, _reported, sweep_id)
            text = None if body is None else json.dumps(body, separators=(",", ":"))
            self._cache[sweep_id] = (time.monotonic(), text)
            self._forget_old()
            return text

    def _forget_old(self) -> None:
        stale = [k for k, (at, _) in self._cache.items() if time.monotonic() - at > 60]
        for k in stale:
            del self._cache[k]
            lock = self._locks.get(k)
            if lock is not None and not lock.locked():
                del self._locks[k]


async def follow(reports: SweepReports, sweep_id: str) -> AsyncIterator[str]:
    """The sweep's events: its report each time it changes, until it has ended."""
    last, quiet = "", 0.0
    while True:
        text = await reports.get(sweep_id)
        if text is None:  # deleted meanwhile
            return
        if text != last:
            last, quiet = text, 0.0
            yield f"event: sweep\ndata: {text}\n\n"
            if json.loads(text)["status"] != SweepStatus.running:
                return
        elif quiet >= KEEPALIVE_S:
            quiet = 0.0
            yield ": keep-alive\n\n"
        await asyncio.sleep(EVENT_POLL_S)
        quiet += EVENT_POLL_S


def _reported(session: Session, sweep_id: str) -> dict[str, Any] | None:
    sweep = get_sweep(session, sweep_id=sweep_id)
    if sweep is None:
        return None
    body: dict[str, Any] = jsonable_encoder(SweepOut.model_validate(trials.report(session, sweep)))
    return body

"""/sweeps: many trials as one experiment (core.sweeps): create, list, inspect, follow,
cancel. Each trial is an ordinary job under /jobs."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.access import IdPrefix, no_dataset, visible_dataset
from api.auth import Caller
from api.cancels import announce_cancel
from api.cursors import decode_cursor, encode_cursor
from api.deps import CallerDep, ReaderDep, RedisDep, SessionDep, read
from api.events import EventHub, EventStreamResponse
from api.schemas import QUOTA_REFUSAL, Problem, QuotaProblem, SweepOut, SweepPage
from core.db import Database, Sweep
from core.spec import user_dataset_id
from core.store import spec_hash
from core.store.sweeps import (
    SweepStatus,
    find_sweep_by_idempotency_key,
    get_sweep,
    list_sweeps,
)
from core.sweeps import trials
from core.sweeps.spec import SweepSpec, bound_problems
from core.text import PLAIN_PATTERN

log = logging.getLogger("trainq.api")

router = APIRouter(prefix="/sweeps", tags=["sweeps"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "Missing or unknown API key."},
    404: {"model": Problem, "description": "No such sweep (or not yours)."},
}
SweepId = Annotated[uuid.UUID, "a sweep id"]
EVENT_POLL_S = 1.0
KEEPALIVE_S = 15.0


def visible_sweep(session: Session, caller: Caller, sweep_id: uuid.UUID | str) -> Sweep:
    """The sweep, if this caller may see it; 404 otherwise (another's reads as missing)."""
    sweep = get_sweep(session, sweep_id=str(sweep_id))
    if sweep is None or not caller.can_see(sweep.owner):
        raise HTTPException(404, detail=f"no sweep {sweep_id}")
    return sweep


@router.post(
    "",
    status_code=201,
    response_model=SweepOut,
    responses={
        **ERRORS,
        200: {"model": SweepOut, "description": "Same Idempotency-Key and body: the same sweep."},
        409: {"model": Problem, "description": "Idempotency-Key reused with another body."},
        422: {"description": "Invalid sweep, or a space outside JobSpec; `loc` names the field."},
        429: {"model": QuotaProblem, "description": QUOTA_REFUSAL},
    },
    summary="Start a sweep",
    description="Creates the sweep and queues its first `parallel` trials (ordinary jobs, "
    "counted against the key's quotas). Each trial that ends makes room for the next, until "
    "`trials` have run. A trial behind the others at an epoch's end is pruned (status "
    "`pruned`).",
)
def create_sweep(
    spec: SweepSpec,
    request: Request,
    response: Response,
    session: SessionDep,
    r: RedisDep,
    caller: CallerDep,
    idempotency_key: Annotated[str | None, Header(max_length=200, pattern=PLAIN_PATTERN)] = None,
) -> Any:
    images = None
    if user_dataset_id(spec.base.dataset) is not None:
        ds = visible_dataset(session, caller, str(user_dataset_id(spec.base.dataset)))
        if ds is None:
            problem = no_dataset(spec.base)
            raise HTTPException(422, detail=[{**problem, "loc": ["body", "base", "dataset"]}])
        c, h, w = ds.image_shape
        images = ((c, h, w), ds.num_classes)
    problems = bound_problems(spec, images)
    if problems:
        raise HTTPException(422, detail=problems)
    if idempotency_key is not None:
        found = find_sweep_by_idempotency_key(session, owner=caller.owner, key=idempotency_key)
        if found is not None:
            return _replay(session, found, spec)
    settings = request.app.state.settings
    try:
        sweep, first = trials.create(
            session,
            settings,
            spec=spec,
            owner=caller.owner,
            quota_owner=caller.quota_owner,
            idempotency_key=idempotency_key,
        )
        session.commit()
    except IntegrityError:  # the same key, used at the same moment in another request
        session.rollback()
        found = find_sweep_by_idempotency_key(
            session, owner=caller.owner, key=idempotency_key or ""
        )
        if found is None:
            raise
        return _replay(session, found, spec)
    trials.enqueue(r, settings, first)
    if len(first) == trials.ASKS_PER_TRANSACTION:  # the rest of `parallel`, a few at a time
        session.close()
        try:
            trials.advance(request.app.state.db, r, settings, sweep_id=sweep.id)
        except Exception as e:  # the sweep stands; the reconciler's pass makes the rest
            log.warning("sweep %s: its first trials are left to the reconciler: %s", sweep.id, e)
    response.headers["Location"] = f"/sweeps/{sweep.id}"
    return trials.report(session, get_sweep(session, sweep_id=sweep.id) or sweep)


def _replay(session: Session, found: Sweep, spec: SweepSpec) -> JSONResponse:
    if found.request_hash != spec_hash(spec.model_dump(mode="json")):
        raise HTTPException(
            409,
            detail="this Idempotency-Key was already used with a different sweep; use a new "
            "key for a new sweep",
        )
    body = jsonable_encoder(SweepOut.model_validate(trials.report(session, found)))
    return JSONResponse(body, status_code=200, headers={"Location": f"/sweeps/{found.id}"})


@router.get("", response_model=SweepPage, responses=ERRORS, summary="List sweeps, newest first")
def get_sweeps(
    session: ReaderDep,
    caller: CallerDep,
    id_prefix: IdPrefix = None,
    cursor: Annotated[str | None, Query(max_length=200, pattern=PLAIN_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=50)] = 20,
) -> SweepPage:
    before = decode_cursor(cursor) if cursor else None
    found = list_sweeps(
        session,
        owner=caller.owner,
        all_owners=caller.admin,
        before=before,
        limit=limit + 1,
        id_prefix=id_prefix.lower() if id_prefix else None,
    )
    page = list(found[:limit])
    nxt = encode_cursor(page[-1].created_at, page[-1].id) if len(found) > limit else None
    items = [SweepOut.model_validate(trials.report(session, sw)) for sw in page]
    return SweepPage(items=items, next=nxt)


@router.get("/{sweep_id}", response_model=SweepOut, responses=ERRORS, summary="One sweep")
def get_one(sweep_id: SweepId, session: ReaderDep, caller: CallerDep) -> Any:
    return trials.report(session, visible_sweep(session, caller, sweep_id))


@router.post(
    "/{sweep_id}/cancel",
    status_code=202,
    response_model=SweepOut,
    responses={**ERRORS, 409: {"model": Problem, "description": "The sweep already ended."}},
    summary="Cancel a sweep",
    description="No more trials are asked for; queued trials end `canceled` and running ones "
    "stop within a few batches. Ended trials keep their results and models.",
)
def cancel(sweep_id: SweepId, session: SessionDep, r: RedisDep, caller: CallerDep) -> Any:
    sweep = visible_sweep(session, caller, sweep_id)
    moved = trials.cancel(session, sweep_id=sweep.id)
    if moved is None:
        raise HTTPException(409, detail=f"sweep {sweep.id} already ended ({sweep.status})")
    session.commit()
    for job, outcome in moved:
        try:
            session.refresh(job)
            announce_cancel(r, job, outcome)
        except RedisError as e:  # committed: workers also read the flag with their heartbeat
            log.warning("job %s: canceled, but Redis was not told: %s", job.id, e)
    session.refresh(sweep)
    return trials.report(session, sweep)


@router.get(
    "/{sweep_id}/events",
    response_class=EventStreamResponse,
    status_code=200,
    responses={
        **ERRORS,
        200: {"content": {"text/event-stream": {}}},
        429: {"model": Problem, "description": "Too many event streams open at once."},
    },
    summary="Server-Sent Events: the sweep, each time it changes",
    description="Each `sweep` event carries the whole sweep, as GET /sweeps/{id} answers it, "
    "whenever a trial starts, finishes an epoch or ends; the stream ends after the sweep's "
    "end.",
)
async def get_events(sweep_id: SweepId, request: Request, caller: CallerDep) -> Any:
    db = request.app.state.db
    await read(db, visible_sweep, caller, sweep_id)
    hub: EventHub = request.app.state.events
    hub.admit(caller.owner)
    reports: SweepReports = request.app.state.sweep_reports
    return EventStreamResponse(hub, caller.owner, _follow(reports, str(sweep_id)))


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


async def _follow(reports: SweepReports, sweep_id: str) -> AsyncIterator[str]:
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

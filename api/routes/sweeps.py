"""/sweeps: many trials as one experiment (core.sweeps): create, list, inspect, follow,
cancel. Each trial is an ordinary job under /jobs. The work is in api.services.sweeps.
See docs/sweeps.md."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from api.access import IdPrefix
from api.cursors import decode_cursor, encode_cursor
from api.deps import (
    CallerDep,
    DatabaseDep,
    EventsDep,
    ReaderDep,
    RedisDep,
    SessionDep,
    SettingsDep,
    SweepReportsDep,
)
from api.events import EventStreamResponse
from api.reads import read
from api.responses import (
    EVENT_STREAM,
    KEY_REUSED,
    NO_KEY,
    NO_SWEEP,
    OVER_QUOTA,
    TOO_MANY_STREAMS,
    problem,
)
from api.schemas import SweepOut, SweepPage, SweepRequest
from api.services import sweeps
from api.services.sweeps import visible_sweep
from core.labels import LabelsPatch
from core.store.sweeps import get_sweep, list_sweeps
from core.sweeps import trials
from core.text import PLAIN_PATTERN

router = APIRouter(prefix="/sweeps", tags=["sweeps"])
ERRORS = {**NO_KEY, **NO_SWEEP}
SweepId = Annotated[uuid.UUID, "a sweep id"]


@router.post(
    "",
    status_code=201,
    response_model=SweepOut,
    responses={
        **ERRORS,
        200: {"model": SweepOut, "description": "Same Idempotency-Key and body: the same sweep."},
        **KEY_REUSED,
        422: {"description": "Invalid sweep, or a space outside JobSpec; `loc` names the field."},
        **OVER_QUOTA,
    },
    summary="Start a sweep",
    description="Creates the sweep and queues its first `parallel` trials (ordinary jobs, "
    "counted against the key's quotas). Each trial that ends makes room for the next, until "
    "`trials` have run. A trial behind the others at an epoch's end is pruned (status "
    "`pruned`). The sweep's `name`, `tags` and `notes` sit beside its fields, no part of "
    "it: each trial starts with its tags and is named `<name> #<trial>`.",
)
def create_sweep(
    body: SweepRequest,
    response: Response,
    session: SessionDep,
    db: DatabaseDep,
    r: RedisDep,
    settings: SettingsDep,
    caller: CallerDep,
    idempotency_key: Annotated[str | None, Header(max_length=200, pattern=PLAIN_PATTERN)] = None,
) -> Any:
    spec = body.spec()
    sweeps.check_bounds(session, caller, spec)
    sweep, again = sweeps.create(
        db, session, r, settings, caller, spec, body.labels(), idempotency_key
    )
    if again is not None:
        return again
    response.headers["Location"] = f"/sweeps/{sweep.id}"
    return trials.report(session, get_sweep(session, sweep_id=sweep.id) or sweep)


@router.get("", response_model=SweepPage, responses=ERRORS, summary="List sweeps, newest first")
def get_sweeps(
    session: ReaderDep,
    caller: CallerDep,
    id_prefix: IdPrefix = None,
    cursor: Annotated[str | None, Query(max_length=200, pattern=PLAIN_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=50)] = 20,
) -> SweepPage:
    found = list_sweeps(
        session,
        owner=caller.owner,
        all_owners=caller.admin,
        before=decode_cursor(cursor) if cursor else None,
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


@router.patch(
    "/{sweep_id}",
    response_model=SweepOut,
    responses={**ERRORS, 422: {"description": "A bad name, tag or note, named in `loc`."}},
    summary="Rename, tag or annotate a sweep",
    description="As PATCH /jobs/{id}. Its trials keep their own: a trial made later starts "
    "with the sweep's tags as they are then.",
)
def patch_sweep(
    sweep_id: SweepId, patch: LabelsPatch, session: SessionDep, caller: CallerDep
) -> Any:
    return trials.report(
        session, sweeps.relabel(session, visible_sweep(session, caller, sweep_id), patch)
    )


@router.post(
    "/{sweep_id}/cancel",
    status_code=202,
    response_model=SweepOut,
    responses={**ERRORS, 409: problem("The sweep already ended.")},
    summary="Cancel a sweep",
    description="No more trials are asked for; queued trials end `canceled` and running ones "
    "stop within a few batches. Ended trials keep their results and models.",
)
def cancel(sweep_id: SweepId, session: SessionDep, r: RedisDep, caller: CallerDep) -> Any:
    sweep = visible_sweep(session, caller, sweep_id)
    sweeps.cancel(session, r, sweep)
    return trials.report(session, sweep)


@router.get(
    "/{sweep_id}/events",
    response_class=EventStreamResponse,
    status_code=200,
    responses={**ERRORS, **EVENT_STREAM, **TOO_MANY_STREAMS},
    summary="Server-Sent Events: the sweep, each time it changes",
    description="Each `sweep` event carries the whole sweep, as GET /sweeps/{id} answers it, "
    "whenever a trial starts, finishes an epoch or ends; the stream ends after the sweep's "
    "end.",
)
async def get_events(
    sweep_id: SweepId,
    db: DatabaseDep,
    hub: EventsDep,
    reports: SweepReportsDep,
    caller: CallerDep,
) -> Any:
    await read(db, visible_sweep, caller, sweep_id)
    hub.admit(caller.owner)
    return EventStreamResponse(hub, caller.owner, sweeps.follow(reports, str(sweep_id)))

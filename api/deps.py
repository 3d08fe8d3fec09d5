"""FastAPI dependencies: what a route needs of the app (the database, Redis, settings, the
caller, the process's limiters and caches), each a typed `...Dep`; and `read`, the one way
async code reads the database. See docs/api.md."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Annotated, Concatenate, ParamSpec, TypeVar

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from sqlalchemy.orm import Session

from api.auth import UNAUTHORIZED, Caller
from core.config import Settings
from core.db import Database, close_quietly

if TYPE_CHECKING:
    from api.events import EventHub
    from api.images import DecodeBudget
    from api.routes.health import HealthCache
    from api.services.submitter import Submitter
    from api.services.sweeps import SweepReports
    from api.slots import KeySlots

P = ParamSpec("P")
T = TypeVar("T")

# The dependencies are `async def` where they never block: FastAPI runs a plain `def`
# dependency in its thread pool, a thread hop per dependency per request.


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_db(request: Request) -> AsyncIterator[Session]:
    """A session per request for routes that write: they commit explicitly. It connects
    lazily, on the first statement, inside the route's own thread."""
    db: Database = request.app.state.db
    s = db.manual_session()
    try:
        yield s
    finally:
        close_quietly(s)


async def get_reader(request: Request) -> AsyncIterator[Session]:
    """A read-only session: on SQLite it never waits for a writer."""
    db: Database = request.app.state.db
    with db.reader() as s:
        yield s


async def get_redis(request: Request) -> Redis:
    r: Redis = request.app.state.redis
    return r


async def get_async_redis(request: Request) -> AsyncRedis:
    r: AsyncRedis = request.app.state.aredis
    return r


async def get_database(request: Request) -> Database:
    """The Database itself, for what opens its own sessions (a deletion, a download's copy,
    the reads of async routes through `read`)."""
    db: Database = request.app.state.db
    return db


async def get_submitter(request: Request) -> Submitter:
    submitter: Submitter = request.app.state.submitter
    return submitter


async def get_events(request: Request) -> EventHub:
    hub: EventHub = request.app.state.events
    return hub


async def get_sweep_reports(request: Request) -> SweepReports:
    reports: SweepReports = request.app.state.sweep_reports
    return reports


async def get_downloads(request: Request) -> KeySlots:
    slots: KeySlots = request.app.state.downloads
    return slots


async def get_uploads(request: Request) -> KeySlots:
    slots: KeySlots = request.app.state.uploads
    return slots


async def get_decode_budget(request: Request) -> DecodeBudget:
    budget: DecodeBudget = request.app.state.decode_budget
    return budget


async def get_health_cache(request: Request) -> HealthCache:
    cache: HealthCache = request.app.state.health
    return cache


async def get_admin_owners(request: Request) -> frozenset[str]:
    """The owners of admin keys (they have no limits)."""
    owners: frozenset[str] = request.app.state.admin_owners
    return owners


async def get_optional_caller(request: Request) -> Caller | None:
    """The caller that api.auth.RequireKey found, before routing; None without a key."""
    caller: Caller | None = request.scope.get("state", {}).get("caller")
    return caller


# The bearer scheme, declared for the OpenAPI (the docs' Authorize button and every route's
# `security`). It only reads the header again: the key was checked by api.auth.RequireKey
# before routing, before any body was read, and the caller found there is the one used.
bearer_key = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="An API key (TRAINQ_API_KEYS), sent as `Authorization: Bearer <key>`.",
)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_key)]


async def get_caller(request: Request, _: BearerDep) -> Caller:
    caller = await get_optional_caller(request)
    if caller is None:
        raise HTTPException(
            status_code=401, detail=UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"}
        )
    return caller


async def get_admin(caller: Annotated[Caller, Depends(get_caller)]) -> Caller:
    """The caller, if its key is an admin's; 403 otherwise (a route for admins alone, listed
    in the docs: refusing it hides nothing)."""
    if not caller.admin:
        raise HTTPException(status_code=403, detail="this route needs an admin key")
    return caller


async def read(
    db: Database, fn: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """`fn(session, *args, **kwargs)` with a read-only session, in the thread pool: a read
    on the event loop would stall every other request while it waits for the database."""

    def in_reader() -> T:
        with db.reader() as session:
            return fn(session, *args, **kwargs)

    return await run_in_threadpool(in_reader)


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_db)]
ReaderDep = Annotated[Session, Depends(get_reader)]
RedisDep = Annotated[Redis, Depends(get_redis)]
AsyncRedisDep = Annotated[AsyncRedis, Depends(get_async_redis)]
CallerDep = Annotated[Caller, Depends(get_caller)]
AdminDep = Annotated[Caller, Depends(get_admin)]
OptionalCallerDep = Annotated[Caller | None, Depends(get_optional_caller)]
DatabaseDep = Annotated[Database, Depends(get_database)]
SubmitterDep = Annotated["Submitter", Depends(get_submitter)]
EventsDep = Annotated["EventHub", Depends(get_events)]
SweepReportsDep = Annotated["SweepReports", Depends(get_sweep_reports)]
DownloadsDep = Annotated["KeySlots", Depends(get_downloads)]
UploadsDep = Annotated["KeySlots", Depends(get_uploads)]
DecodeBudgetDep = Annotated["DecodeBudget", Depends(get_decode_budget)]
HealthCacheDep = Annotated["HealthCache", Depends(get_health_cache)]
AdminOwnersDep = Annotated[frozenset[str], Depends(get_admin_owners)]

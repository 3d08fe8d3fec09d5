"""FastAPI dependencies: what a route needs of the app (the database, Redis, settings, the
caller, the process's limiters and caches), each a typed `...Dep`. See docs/api.md."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from sqlalchemy.orm import Session

from api.auth import UNAUTHORIZED, Caller
from core.config import Settings
from core.db import Database, close_quietly

if TYPE_CHECKING:
    from api.events import EventHub
    from api.health_cache import HealthCache
    from api.parsers import Parsers
    from api.services.submitter import Submitter
    from api.services.sweeps import SweepReports
    from api.slots import KeySlots

# The dependencies are `async def` where they never block: FastAPI runs a plain `def`
# dependency in its thread pool, a thread hop per dependency per request.


def app_state(name: str) -> Callable[[Request], Awaitable[Any]]:
    """A dependency that answers what the app holds as `name` (set by api.app.lifespan);
    its type is the one its `...Dep` below declares."""

    async def held(request: Request) -> Any:
        return getattr(request.app.state, name)

    held.__name__ = f"get_{name}"
    return held


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


SettingsDep = Annotated[Settings, Depends(app_state("settings"))]
SessionDep = Annotated[Session, Depends(get_db)]
ReaderDep = Annotated[Session, Depends(get_reader)]
RedisDep = Annotated[Redis, Depends(app_state("redis"))]
AsyncRedisDep = Annotated[AsyncRedis, Depends(app_state("aredis"))]
CallerDep = Annotated[Caller, Depends(get_caller)]
AdminDep = Annotated[Caller, Depends(get_admin)]
OptionalCallerDep = Annotated[Caller | None, Depends(get_optional_caller)]
DatabaseDep = Annotated[Database, Depends(app_state("db"))]
SubmitterDep = Annotated["Submitter", Depends(app_state("submitter"))]
EventsDep = Annotated["EventHub", Depends(app_state("events"))]
SweepReportsDep = Annotated["SweepReports", Depends(app_state("sweep_reports"))]
DownloadsDep = Annotated["KeySlots", Depends(app_state("downloads"))]
UploadsDep = Annotated["KeySlots", Depends(app_state("uploads"))]
ParsersDep = Annotated["Parsers", Depends(app_state("parsers"))]
HealthCacheDep = Annotated["HealthCache", Depends(app_state("health"))]
# The owners of admin keys (they have no limits).
AdminOwnersDep = Annotated[frozenset[str], Depends(app_state("admin_owners"))]

"""FastAPI dependencies: the database session, Redis, settings and the caller, and the one
way async code reads the database.

Reading the database from the API: a route that reads or writes it is a plain `def`, which
FastAPI runs in its thread pool, and takes its session from `ReaderDep` (read-only; on
SQLite it never waits for a writer) or `SessionDep` (the route commits it). An `async def`
route, or anything else on the event loop (the live event feeds), never touches a session
there: it awaits `read(db, fn, *args)`, which runs `fn(session, *args)` with a read-only
session in the same thread pool. Nothing in the API writes from async code. Only what no
route hands a session opens its own, on a thread it already runs on: the submitter's writer
thread (POST /jobs) and the /metrics collector (called from its route's thread)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated, Concatenate, ParamSpec, TypeVar

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from sqlalchemy.orm import Session

from api.auth import UNAUTHORIZED, Caller
from core.config import Settings
from core.db import Database, close_quietly

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

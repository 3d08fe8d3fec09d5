"""FastAPI dependencies: the database session, Redis, settings and the caller."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, HTTPException, Request
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from sqlalchemy.orm import Session

from api.auth import UNAUTHORIZED, Caller
from core.config import Settings
from core.db import Database

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
    with db.manual_session() as s:
        yield s


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


async def get_caller(request: Request) -> Caller:
    caller = await get_optional_caller(request)
    if caller is None:
        raise HTTPException(
            status_code=401, detail=UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"}
        )
    return caller


async def run_read(request: Request, fn: Callable[..., T], *args: Any) -> T:
    """A short database read of a much-polled route. On SQLite it runs right here, on the
    event loop: in WAL mode a read never waits for a writer, and it takes less time (0.1 to
    0.3 ms) than handing it to a thread costs (about 0.5 ms of CPU for the GIL handoffs,
    measured on GET /jobs/{id}/metrics). Another database is across a network: its reads go
    to a few threads kept for them (every extra thread that wants the GIL makes each
    handoff dearer)."""
    db: Database = request.app.state.db
    if db.local:
        return fn(*args)
    limiter: anyio.CapacityLimiter = request.app.state.io_threads
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_db)]
ReaderDep = Annotated[Session, Depends(get_reader)]
RedisDep = Annotated[Redis, Depends(get_redis)]
AsyncRedisDep = Annotated[AsyncRedis, Depends(get_async_redis)]
CallerDep = Annotated[Caller, Depends(get_caller)]
OptionalCallerDep = Annotated[Caller | None, Depends(get_optional_caller)]

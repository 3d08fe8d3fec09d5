"""FastAPI dependencies: the database session, Redis, settings and the caller."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from sqlalchemy.orm import Session

from api.auth import Caller, KeyRing
from core.config import Settings
from core.db import Database


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_db(request: Request) -> Iterator[Session]:
    """A session per request; routes that write commit explicitly, the rest roll back."""
    db: Database = request.app.state.db
    with db.sessions() as s:
        yield s


def get_redis(request: Request) -> Redis:
    r: Redis = request.app.state.redis
    return r


def get_async_redis(request: Request) -> AsyncRedis:
    r: AsyncRedis = request.app.state.aredis
    return r


def get_caller(request: Request) -> Caller:
    keys: KeyRing = request.app.state.keys
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    caller = keys.check(token.strip()) if scheme.lower() == "bearer" and token else None
    if caller is None:
        raise HTTPException(
            status_code=401,
            detail="missing or unknown API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return caller


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_db)]
RedisDep = Annotated[Redis, Depends(get_redis)]
AsyncRedisDep = Annotated[AsyncRedis, Depends(get_async_redis)]
CallerDep = Annotated[Caller, Depends(get_caller)]

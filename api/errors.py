"""Errors to status codes, in one place. Nothing a client sends becomes a 500."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import OutOfMemoryError, RedisError
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from core.errors import (
    DatasetInUse,
    JobActive,
    ModelPurged,
    QuotaExceeded,
    TooManyFollowers,
    TrainqError,
)

log = logging.getLogger("trainq.api")
# The named errors a route lets through, and what each answers.
STATUS: dict[type[TrainqError], int] = {
    JobActive: 409,
    DatasetInUse: 409,
    ModelPurged: 410,
}
RETRY_AFTER_S = "5"
# A full Redis frees memory as streams of ended jobs expire, or when an operator acts:
# seconds are not enough.
FULL_RETRY_AFTER_S = "30"


def _json_safe(value: Any) -> Any:
    """JSON has no NaN or Infinity: echo them back as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        """422 naming each field (`loc`), also when the input held NaN or Infinity."""
        return JSONResponse({"detail": _json_safe(jsonable_encoder(exc.errors()))}, 422)

    async def refused(_: Request, exc: Exception) -> JSONResponse:
        """trainq's named refusals (core.errors), each with its status code."""
        assert isinstance(exc, TrainqError)
        return JSONResponse({"detail": exc.message}, status_code=STATUS[type(exc)])

    for error in STATUS:
        app.add_exception_handler(error, refused)

    @app.exception_handler(RedisError)
    async def redis_away(_: Request, exc: Exception) -> JSONResponse:
        """Any Redis failure, not only a lost connection: a refused command (a server out
        of memory, a read-only replica, a loading one) is as retryable for the client."""
        if out_of_memory(exc):
            what = "the queue (Redis) is full: it refuses writes past its maxmemory"
            return _unavailable(what, exc, FULL_RETRY_AFTER_S)
        return _unavailable("the queue (Redis) is unavailable or refused the command", exc)

    @app.exception_handler(QuotaExceeded)
    async def over_quota(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, QuotaExceeded)
        return quota_refusal(exc)

    @app.exception_handler(TooManyFollowers)
    async def too_many_followers(_: Request, exc: TooManyFollowers) -> JSONResponse:
        """429 naming the limit: the client may follow again once one of its streams ends."""
        body = {"detail": exc.message, "limit": exc.limit, "allowed": exc.allowed}
        return JSONResponse(body, status_code=429, headers={"Retry-After": RETRY_AFTER_S})

    @app.exception_handler(PoolTimeout)
    async def pool_exhausted(_: Request, exc: Exception) -> JSONResponse:
        return _unavailable("every database connection of this API process is in use", exc)

    @app.exception_handler(OperationalError)
    async def database_busy(_: Request, exc: Exception) -> JSONResponse:
        return _unavailable("the database is busy or unavailable", exc)


def quota_refusal(exc: QuotaExceeded) -> JSONResponse:
    """429 naming the limit, its value, the key's usage of it and the key's owner id, with
    Retry-After where waiting helps (api.schemas.QuotaProblem)."""
    body = {
        "detail": exc.message,
        "limit": exc.limit,
        "value": exc.value,
        "usage": exc.usage,
        "owner": exc.owner,
        "retry_after_s": exc.retry_after_s,
    }
    headers = {} if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}
    return JSONResponse(body, status_code=429, headers=headers)


def out_of_memory(exc: Exception) -> bool:
    """Redis refused a write past its maxmemory: the OOM reply, also as a script's error
    (a script's refused write comes back as a plain error that quotes it)."""
    return isinstance(exc, OutOfMemoryError) or "OOM command not allowed" in str(exc)


def _unavailable(what: str, exc: Exception, retry_after_s: str = RETRY_AFTER_S) -> JSONResponse:
    """503 + Retry-After: the client did nothing wrong and may simply try again."""
    log.warning("%s: %s", what, exc)
    return JSONResponse(
        {"detail": f"{what}; retry shortly"},
        status_code=503,
        headers={"Retry-After": retry_after_s},
    )

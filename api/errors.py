"""Errors to status codes, in one place. Nothing a client sends becomes a 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import OperationalError

log = logging.getLogger("trainq.api")
RETRY_AFTER_S = "5"


def install(app: FastAPI) -> None:
    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def redis_away(_: Request, exc: Exception) -> JSONResponse:
        log.warning("redis unavailable: %s", exc)
        return JSONResponse(
            {"detail": "the queue (Redis) is unavailable; retry shortly"},
            status_code=503,
            headers={"Retry-After": RETRY_AFTER_S},
        )

    @app.exception_handler(OperationalError)
    async def database_busy(_: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable: %s", exc)
        return JSONResponse(
            {"detail": "the database is busy or unavailable; retry shortly"},
            status_code=503,
            headers={"Retry-After": RETRY_AFTER_S},
        )

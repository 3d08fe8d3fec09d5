"""The FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from redis.asyncio import Redis as AsyncRedis

from api import errors
from api.auth import KeyRing
from api.routes import health, jobs
from core.config import Settings
from core.db import Database
from core.redis_server import connect

MAX_BODY_BYTES = 1 << 20  # a job spec is a few hundred bytes


def create_app(settings: Settings, redis_url: str) -> FastAPI:
    """`redis_url` is resolved by the caller (the embedded server is started outside)."""
    keys = KeyRing(settings.api_key_list, settings.admin_key_list)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.keys = keys
        app.state.db = Database.from_settings(settings)
        app.state.redis = connect(redis_url)
        app.state.aredis = AsyncRedis.from_url(redis_url, socket_connect_timeout=5)
        yield
        await app.state.aredis.aclose()
        app.state.redis.close()
        app.state.db.dispose()

    app = FastAPI(
        title="trainq",
        summary="Training-as-a-service for PyTorch",
        description="Submit training jobs, follow their per-batch metrics live, download "
        "TorchScript models. Every route but /health needs `Authorization: Bearer <key>`.",
        version="0.1.0",
        lifespan=lifespan,
    )
    errors.install(app)

    @app.middleware("http")
    async def limit_body(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return JSONResponse(
                {"detail": f"request body over {MAX_BODY_BYTES} bytes"}, status_code=413
            )
        return await call_next(request)

    app.include_router(health.router)
    app.include_router(jobs.router)
    return app

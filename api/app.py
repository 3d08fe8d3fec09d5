"""The FastAPI application: what it holds while it runs, and its routers. See docs/api.md."""

from __future__ import annotations

import gc
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import Depends, FastAPI

from api import errors, observability
from api.auth import KeyRing, RequireKey
from api.downloads import download_slots
from api.events import IDLE_BLOCK_MS, EventHub
from api.health_cache import HealthCache
from api.images import give_back_large_buffers
from api.parsers import Parsers
from api.routes import (
    datasets,
    docs,
    health,
    jobs,
    model_serving,
    predict,
    quotas,
    registry,
    sweeps,
    web,
    webhooks,
)
from api.services.datasets import upload_slots
from api.services.submitter import Submitter
from api.services.sweeps import SweepReports
from core.config import Settings
from core.db import Database
from core.redis_client import connect, connect_async

MAX_BODY_BYTES = 1 << 20  # a job spec is a few hundred bytes
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def lifespan(settings: Settings, redis_url: str) -> Lifespan:
    """What the app holds while it runs: the database, Redis clients, the submitter and the
    live event feeds, all closed when it stops."""

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.health = HealthCache()
        app.state.db = Database.from_settings(settings, pooled=True)
        app.state.redis = connect(redis_url)
        app.state.aredis = connect_async(redis_url, longest_block_s=IDLE_BLOCK_MS / 1000)
        app.state.submitter = Submitter(app.state.db, redis_url, settings)
        app.state.events = EventHub(app.state.db, app.state.aredis, settings)
        app.state.downloads = download_slots(settings)
        app.state.uploads = upload_slots(settings)
        app.state.parsers = Parsers(settings)
        # Started beside the app: the first predict finds its children ready.
        threading.Thread(target=app.state.parsers.warm, name="warm-parsers", daemon=True).start()
        give_back_large_buffers()  # upload bodies and their parsed sets (decodes: the children)
        app.state.sweep_reports = SweepReports(app.state.db)
        # Everything made so far lives as long as the process: out of the collector's sight,
        # full collections no longer walk it (each walk stalled every request in flight).
        gc.freeze()
        yield
        app.state.submitter.close()
        app.state.parsers.close()
        await app.state.aredis.aclose()
        app.state.redis.close()
        app.state.db.dispose()

    return run


def from_environment() -> FastAPI:
    """The app of one of several API processes (`trainq serve --workers N`): the serving
    command has put everything it resolved into the environment they start with."""
    settings = Settings()
    if not settings.redis_url:
        raise RuntimeError("TRAINQ_REDIS_URL is not set: start the API with `trainq serve`")
    return create_app(settings, settings.redis_url)


def create_app(settings: Settings, redis_url: str) -> FastAPI:
    """`redis_url` is resolved by the caller (the embedded server is started outside)."""
    keys = KeyRing(settings.api_key_list, settings.admin_key_list)
    app = FastAPI(
        title="trainq",
        summary="Training-as-a-service for PyTorch",
        description="Submit training jobs, follow their per-batch metrics live, download "
        "the models as TorchScript, torch.export (.pt2) or ONNX, and classify images with "
        "them. Every route but /health, the dashboard and these docs needs "
        "`Authorization: Bearer <key>`.",
        version="0.1.0",
        lifespan=lifespan(settings, redis_url),
        docs_url=None,  # api.routes.docs: the same pages, with no CDN
        redoc_url=None,
        # 413 before the body is parsed, chunked uploads included; /predict and /datasets
        # set their own.
        max_body_size=MAX_BODY_BYTES,
        dependencies=[Depends(observability.record_route)],
    )
    app.state.admin_owners = frozenset(keys.admin_owners())  # GET /usage: they have no limits
    errors.install(app)
    # Added before the timing middleware, so that it runs inside it: refusals are timed too.
    app.add_middleware(RequireKey, keys=keys)
    observability.install(app)

    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(predict.router)
    app.include_router(datasets.router)
    app.include_router(quotas.router)
    app.include_router(sweeps.router)
    app.include_router(registry.router)
    app.include_router(model_serving.router)
    app.include_router(webhooks.router)
    app.include_router(web.router)
    app.include_router(docs.router)
    return app

"""/health: no key needed; says whether the database and Redis answer, and who works.

Load balancers and every client poll it, so one process probes at most once a second
and shares the answer (reading the workers costs RQ a Redis round trip per worker)."""

from __future__ import annotations

import threading
import time

from fastapi import APIRouter, Request
from rq import Worker
from rq.serializers import JSONSerializer
from sqlalchemy import text

from api.schemas import Health, WorkerOut
from core.db import Database
from core.queue import job_queue

router = APIRouter(tags=["health"])


class HealthCache:
    """The last answer of one API process, at most `fresh_s` old."""

    def __init__(self, fresh_s: float = 1.0) -> None:
        self.fresh_s = fresh_s
        self._lock = threading.Lock()
        self._last: tuple[float, Health] | None = None

    def get(self, request: Request) -> Health:
        with self._lock:  # concurrent callers wait for one probe instead of each making one
            if self._last is None or time.monotonic() - self._last[0] > self.fresh_s:
                self._last = (time.monotonic(), _probe(request))
            return self._last[1]


@router.get("/health", response_model=Health, summary="Database, Redis, queue and workers")
def health(request: Request) -> Health:
    cache: HealthCache = request.app.state.health
    return cache.get(request)


def _probe(request: Request) -> Health:
    db: Database = request.app.state.db
    settings = request.app.state.settings
    try:
        with db.readers() as s:
            s.execute(text("SELECT 1"))
        db_ok = True
    except Exception:
        db_ok = False
    r = request.app.state.redis
    depth: int | None = None
    workers: list[WorkerOut] = []
    try:
        q = job_queue(r, settings.queue)
        depth = q.count
        for w in Worker.all(connection=r, queue=q, serializer=JSONSerializer):
            workers.append(
                WorkerOut(name=w.name, state=str(w.get_state()), current_job=w.get_current_job_id())
            )
        redis_ok = True
    except Exception:
        redis_ok = False
    return Health(
        status="ok" if db_ok and redis_ok else "degraded",
        database=db_ok,
        redis=redis_ok,
        queue_depth=depth,
        workers=sorted(workers, key=lambda w: w.name),
    )

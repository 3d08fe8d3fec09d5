"""/health: no key needed; says whether the database and Redis answer, and who works."""

from __future__ import annotations

from fastapi import APIRouter, Request
from rq import Worker
from rq.serializers import JSONSerializer
from sqlalchemy import text

from api.schemas import Health, WorkerOut
from core.db import Database
from core.queue import job_queue

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, summary="Database, Redis, queue and workers")
def health(request: Request) -> Health:
    db: Database = request.app.state.db
    settings = request.app.state.settings
    try:
        with db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
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

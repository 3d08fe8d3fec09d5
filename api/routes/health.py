"""/health: no key needed; whether the database and Redis answer (503 with Retry-After when
either is away or Redis refuses writes), the queue and the workers; probed at most once a
second per process, each wait on the database or Redis bounded (PROBE_WAIT_S).
See docs/operations.md."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from itertools import islice
from typing import TypeVar

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, Worker, worker_registration
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker
from sqlalchemy.orm import Session

from api.deps import DatabaseDep, HealthCacheDep, OptionalCallerDep, RedisDep, SettingsDep
from api.errors import RETRY_AFTER_S
from api.health_cache import HealthCache
from api.schemas import Health, VersionsOut, WorkerOut
from api.services.webhooks import delivery_watch
from api.webhook_schemas import DeliveryStateOut
from core.config import Settings
from core.db import Database
from core.queue import job_id_of, job_queue
from core.redis_client import wrong_type
from core.schema import database_revision
from core.store import accepted_entries
from core.versions import FIELDS, Versions, running_versions

log = logging.getLogger("trainq.api")
router = APIRouter(tags=["health"])
T = TypeVar("T")

PROBE_KEY = "trainq:health-probe"  # written by each probe; it expires at once
PROBE_TTL_MS = 2000
# The longest a probe waits for the database, and for Redis (at once), whatever they do: an
# orchestrator's probe gives up after a second or so (Kubernetes' default: 1 s).
PROBE_WAIT_S = 1.0


class HealthOut(BaseModel):
    status: str = Field(description="ok, or degraded (503) when the database or Redis is away.")
    database: bool
    database_problem: str | None = Field(
        None,
        description="Why the database counts as away: it fails, or it did not answer within "
        "the probe's wait.",
    )
    redis: bool
    redis_problem: str | None = Field(
        None,
        description="Why Redis counts as away: it does not answer (within the probe's wait), "
        "or it refuses writes (full, MISCONF, read-only).",
    )
    queue_depth: int | None = Field(
        description="Entries on the queue a worker will run (not those of jobs canceled "
        "after they were queued); null if Redis or the database is away."
    )
    workers_alive: int | None = Field(description="Registered workers; null if Redis is away.")
    workers: list[WorkerOut] | None = Field(description="With an admin key only.")
    versions: list[VersionsOut] | None = Field(
        None,
        description="With an admin key only: each version of trainq seen, this API's first, "
        "then those its workers registered.",
    )
    database_schema: str | None = Field(
        None, description="With an admin key only: the database's schema revision."
    )
    version_skew: bool | None = Field(
        None,
        description="With an admin key only: whether a worker runs another trainq, JobSpec "
        "or schema than this API, or the database is at another revision than the API "
        "knows. A worker that cannot read a job hands it back for one that can "
        "(worker_version_skew once they all fail to).",
    )
    webhooks: DeliveryStateOut | None = Field(
        None,
        description="Webhook delivery: paused, or degraded when no dispatcher finished a pass "
        "in 30 s (dead or stuck); it leaves `status` and the answer's code alone. Null while "
        "the database is away or slow.",
    )


@router.get(
    "/health",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "The database or Redis is away."}},
    summary="Database, Redis, queue and workers",
)
def health(
    response: Response,
    db: DatabaseDep,
    r: RedisDep,
    settings: SettingsDep,
    cache: HealthCacheDep,
    caller: OptionalCallerDep,
) -> HealthOut:
    seen = cache.get(lambda: _probe(cache, db, r, settings))
    if not (seen.database and seen.redis):
        response.status_code = 503
        response.headers["Retry-After"] = RETRY_AFTER_S
    out = HealthOut(
        status=seen.status,
        database=seen.database,
        database_problem=seen.database_problem,
        redis=seen.redis,
        redis_problem=seen.redis_problem,
        queue_depth=seen.queue_depth,
        workers_alive=len(seen.workers) if seen.redis else None,
        workers=None,
    )
    if caller is not None and caller.admin:
        out.workers = seen.workers
        out.database_schema = seen.database_schema
        out.versions, out.version_skew = _versions_seen(seen)
    out.webhooks = _webhook_delivery(db) if seen.database else None
    return out


def _webhook_delivery(db: Database) -> DeliveryStateOut | None:
    """Webhook delivery's state: the last read of api.services.webhooks.DeliveryWatch, never
    waited for."""
    return delivery_watch(db).look()


def _versions_seen(seen: Health) -> tuple[list[VersionsOut], bool]:
    """Each version seen, the API's own first, and whether any differs from the API's (a
    worker that registered none is of a trainq from before this check: it differs too)."""
    own = running_versions()
    versions = [_out(own)]
    for w in seen.workers:
        if w.versions is not None and w.versions not in versions:
            versions.append(w.versions)
    skew = len(versions) > 1 or any(w.versions is None for w in seen.workers)
    if seen.database and seen.database_schema != own.schema:
        skew = True
    return versions, skew


REGISTRATIONS_READ_MAX = 1000  # per probe: only a Redis writer can grow the set past workers


def registered_workers(q: Queue) -> list[BaseWorker]:
    """The queue's registered RQ workers, as RQ reads them. Whoever can write to Redis can
    register a worker RQ cannot read (a junk date, a name that is not UTF-8, a key that is
    no hash, one that does not exist): it is skipped and dropped from the set, and costs
    neither /health nor /metrics their answer. A probe reads REGISTRATIONS_READ_MAX of the
    set at most, so one grown by the million costs no probe more than that."""
    workers = []
    listed = worker_registration.WORKERS_BY_QUEUE_KEY % q.name
    members = set(islice(q.connection.sscan_iter(listed, count=100), REGISTRATIONS_READ_MAX))
    for member in sorted(members, key=str):
        try:
            # RQ's own reading of the set decodes all its members at once: one fails it all
            key = member.decode() if isinstance(member, bytes) else member
            w = Worker.find_by_key(key, connection=q.connection, serializer=JSONSerializer)
            if w is None:  # gone: RQ drops it from its set of all workers, not the queue's
                q.connection.srem(listed, member)
                continue
            w.get_current_job_id()  # read now: it may be junk too
            workers.append(w)
        except (RedisConnectionError, RedisTimeoutError):
            raise  # Redis away: /health says so
        except Exception as e:  # a key of another type (WRONGTYPE) included
            log.warning("dropped the worker registration %.100r: %s", member, e)
            q.connection.srem(listed, member)  # a live worker's next beat writes it back
    return workers


@dataclass(frozen=True)
class Listed:
    """The head of the queue (DEPTH_READ_MAX entries at most) and its whole length."""

    entries: list[bytes]
    total: int

    def job_ids(self) -> set[str]:
        return {i for i in map(job_id_of, self.entries) if i is not None}

    def depth(self, accepted: dict[str, str | None]) -> int:
        """The entries a worker will run, given the entry each listed job's claim accepts
        (core.store.accepted_entries): every entry past the head counts."""
        return self.total - sum(1 for e in self.entries if not _will_run(e, accepted))


def _will_run(entry: bytes, accepted: dict[str, str | None]) -> bool:
    job_id = job_id_of(entry)
    if job_id is None:
        return False
    return job_id not in accepted or accepted[job_id] == entry.decode()


@dataclass(frozen=True)
class RedisSeen:
    listed: Listed | None  # None: the queue's key holds no list
    workers: list[WorkerOut]


@dataclass(frozen=True)
class DatabaseSeen:
    schema: str | None


def _probe(cache: HealthCache, db: Database, r: Redis, settings: Settings) -> Health:
    """Redis and the database, read at once in threads of their own and each waited for
    PROBE_WAIT_S at most, then the rows of the jobs Redis listed (for the queue's depth),
    waited for as long again: a server that stalls is away within 2 x PROBE_WAIT_S, and its
    read, still stuck, is not started again by the next probe (HealthCache.part)."""
    deadline = time.monotonic() + PROBE_WAIT_S
    redis_read = cache.part("redis", lambda: _read_redis(r, settings))
    db_read = cache.part("database", lambda: _read_database(db))
    redis_seen, problem = _redis_answer(redis_read, deadline)
    # Each answer unpacked apart: mypy would take T from the targets' types.
    answer = _database_answer(db_read, deadline)
    db_seen, db_problem = answer
    depth = None
    if redis_seen and redis_seen.listed and db_seen:
        listed = redis_seen.listed
        rows_read = cache.part("queue rows", lambda: _depth(db, listed))
        counted = _database_answer(rows_read, time.monotonic() + PROBE_WAIT_S)
        depth, db_problem = counted
    db_ok = db_seen is not None and db_problem is None
    return Health(
        status="ok" if db_ok and redis_seen else "degraded",
        database=db_ok,
        database_problem=db_problem,
        redis=redis_seen is not None,
        redis_problem=problem,
        queue_depth=depth,
        workers=redis_seen.workers if redis_seen else [],
        database_schema=db_seen.schema if db_seen else None,
    )


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _redis_answer(read: Future[RedisSeen], deadline: float) -> tuple[RedisSeen | None, str | None]:
    """What Redis's read saw, or why Redis is away. Only a Redis error or the wait running
    out is Redis away; anything else is a fault, and answers 500."""
    try:
        return read.result(timeout=_left(deadline)), None
    except TimeoutError:
        problem = f"Redis did not answer within {PROBE_WAIT_S:g} s"
    except RedisError as e:
        problem = redis_problem(e)
    log.warning("health: Redis is away: %s", problem)
    return None, problem


def _database_answer(read: Future[T], deadline: float) -> tuple[T | None, str | None]:
    """What a read of the database returned, or why the database is away: any failure (the
    error is logged, not shown: /health needs no key) or the wait running out."""
    try:
        return read.result(timeout=_left(deadline)), None
    except TimeoutError:
        problem = f"the database did not answer within {PROBE_WAIT_S:g} s"
    except Exception as e:
        problem = "the database failed the probe"
        log.warning("health: the database failed the probe: %s", e)
    return None, problem


def _read_redis(r: Redis, settings: Settings) -> RedisSeen:
    r.set(PROBE_KEY, b"1", px=PROBE_TTL_MS)  # reads alone pass while writes are refused
    q = job_queue(r, settings.queue)
    listed = listed_entries(q)
    found = registered_workers(q)
    workers = [
        WorkerOut(
            name=w.name,
            state=str(w.get_state()),
            current_job=w.get_current_job_id(),
            versions=versions,
        )
        for w, versions in zip(found, _registered_versions(r, found), strict=True)
    ]
    return RedisSeen(listed, sorted(workers, key=lambda w: w.name))


def _read_database(db: Database) -> DatabaseSeen:
    with db.reader() as s:
        return DatabaseSeen(database_revision(s.connection()))


def _depth(db: Database, listed: Listed) -> int:
    with db.reader() as s:
        return listed.depth(accepted_entries(s, job_ids=listed.job_ids()))


DEPTH_READ_MAX = 10_000  # entries a probe reads; those past them count as waiting


def listed_entries(q: Queue) -> Listed | None:
    """The queue's head; None when the queue's key holds no list (written by anyone who can
    write to Redis; the next worker to start deletes it): a fault of that key, not Redis
    away."""
    try:
        entries: list[bytes] = q.connection.lrange(q.key, 0, DEPTH_READ_MAX - 1)  # type: ignore[assignment]
        total = q.count if len(entries) == DEPTH_READ_MAX else len(entries)
    except ResponseError as e:
        if not wrong_type(e):
            raise
        log.warning("health: the queue's key %s holds no list", q.key)
        return None
    return Listed(entries, total)


def queue_depth(q: Queue, s: Session) -> int | None:
    """The entries on the queue a worker will run: an entry of a queued job that its claim
    accepts, or a direct entry (its row is written as a worker admits it). An entry whose
    job was canceled or requeued under another entry after it was queued stays on the queue
    until a worker takes and skips it, and one naming no job is dropped: neither counts.
    None when the queue's key holds no list (listed_entries)."""
    listed = listed_entries(q)
    if listed is None:
        return None
    return listed.depth(accepted_entries(s, job_ids=listed.job_ids()))


def redis_problem(e: RedisError) -> str:
    """What a Redis error says of Redis, in words of trainq's own (the error's may name a
    socket path, and /health needs no key)."""
    if isinstance(e, (RedisConnectionError, RedisTimeoutError)):
        return "Redis does not answer"
    if isinstance(e, OutOfMemoryError):
        return "Redis is full (maxmemory): it is not writable"
    if isinstance(e, ReadOnlyError):
        return "Redis is a read-only replica: it is not writable"
    if isinstance(e, ResponseError) and str(e).startswith("MISCONF"):
        return "Redis cannot persist to its disk (MISCONF): it is not writable"
    return "Redis refused a command"


def _registered_versions(r: Redis, workers: list[BaseWorker]) -> list[VersionsOut | None]:
    """The versions each worker registered (worker.rq_worker), in one round trip."""
    with r.pipeline(transaction=False) as p:
        for w in workers:
            p.hmget(w.key, list(FIELDS))
        rows = p.execute()
    out: list[VersionsOut | None] = []
    for row in rows:
        fields = {k: v.decode(errors="replace") for k, v in zip(FIELDS, row, strict=True) if v}
        versions = Versions.from_fields(fields)
        out.append(None if versions is None else _out(versions))
    return out


def _out(v: Versions) -> VersionsOut:
    return VersionsOut(trainq=v.trainq, spec=v.spec, schema_revision=v.schema)

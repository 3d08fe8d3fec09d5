"""/health: no key needed; whether the database and Redis answer (503 with Retry-After when
either is away or Redis refuses writes), the queue and the workers; probed at most once a
second per process. See docs/operations.md."""

from __future__ import annotations

import logging
from itertools import islice

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

from api.deps import HealthCacheDep, OptionalCallerDep, ReaderDep, RedisDep, SettingsDep
from api.errors import RETRY_AFTER_S
from api.schemas import Health, VersionsOut, WorkerOut
from core.config import Settings
from core.queue import job_id_of, job_queue
from core.redis_client import wrong_type
from core.schema import database_revision
from core.store import accepted_entries
from core.versions import FIELDS, Versions, running_versions

log = logging.getLogger("trainq.api")
router = APIRouter(tags=["health"])

PROBE_KEY = "trainq:health-probe"  # written by each probe; it expires at once
PROBE_TTL_MS = 2000


class HealthOut(BaseModel):
    status: str = Field(description="ok, or degraded (503) when the database or Redis is away.")
    database: bool
    redis: bool
    redis_problem: str | None = Field(
        None,
        description="Why Redis counts as away: it does not answer, or it refuses writes "
        "(full, MISCONF, read-only).",
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


@router.get(
    "/health",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "The database or Redis is away."}},
    summary="Database, Redis, queue and workers",
)
def health(
    response: Response,
    session: ReaderDep,
    r: RedisDep,
    settings: SettingsDep,
    cache: HealthCacheDep,
    caller: OptionalCallerDep,
) -> HealthOut:
    seen = cache.get(lambda: _probe(session, r, settings))
    if not (seen.database and seen.redis):
        response.status_code = 503
        response.headers["Retry-After"] = RETRY_AFTER_S
    out = HealthOut(
        status=seen.status,
        database=seen.database,
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
    return out


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


def _probe(session: Session, r: Redis, settings: Settings) -> Health:
    schema: str | None = None
    try:
        schema = database_revision(session.connection())
        db_ok = True
    except Exception:
        db_ok = False
    depth: int | None = None
    workers: list[WorkerOut] = []
    problem: str | None = None
    try:
        r.set(PROBE_KEY, b"1", px=PROBE_TTL_MS)  # reads alone pass while writes are refused
        q = job_queue(r, settings.queue)
        depth = queue_depth(q, session) if db_ok else None  # which entries wait: their rows
        found = registered_workers(q)
        for w, versions in zip(found, _registered_versions(r, found), strict=True):
            workers.append(
                WorkerOut(
                    name=w.name,
                    state=str(w.get_state()),
                    current_job=w.get_current_job_id(),
                    versions=versions,
                )
            )
        redis_ok = True
    except RedisError as e:  # only that is Redis away; anything else is a fault, and answers 500
        redis_ok = False
        problem = redis_problem(e)
        log.warning("health: Redis is away: %s (%s)", problem, e)
    return Health(
        status="ok" if db_ok and redis_ok else "degraded",
        database=db_ok,
        redis=redis_ok,
        redis_problem=problem,
        queue_depth=depth,
        workers=sorted(workers, key=lambda w: w.name),
        database_schema=schema,
    )


DEPTH_READ_MAX = 10_000  # entries a probe reads; those past them count as waiting


def queue_depth(q: Queue, s: Session) -> int | None:
    """The entries on the queue a worker will run: an entry of a queued job that its claim
    accepts, or a direct entry (its row is written as a worker admits it). An entry whose
    job was canceled or requeued under another entry after it was queued stays on the queue
    until a worker takes and skips it, and one naming no job is dropped: neither counts.
    None when the queue's key holds no list (written by anyone who can write to Redis; the
    next worker to start deletes it): a fault of that key, not Redis away."""
    try:
        listed: list[bytes] = q.connection.lrange(q.key, 0, DEPTH_READ_MAX - 1)  # type: ignore[assignment]
        total = q.count if len(listed) == DEPTH_READ_MAX else len(listed)
    except ResponseError as e:
        if not wrong_type(e):
            raise
        log.warning("health: the queue's key %s holds no list", q.key)
        return None
    ids = {entry: job_id_of(entry) for entry in listed}
    accepted = accepted_entries(s, job_ids={i for i in ids.values() if i is not None})
    skipped = sum(1 for entry in listed if not _will_run(entry, ids[entry], accepted))
    return total - skipped


def _will_run(entry: bytes, job_id: str | None, accepted: dict[str, str | None]) -> bool:
    if job_id is None:
        return False
    return job_id not in accepted or accepted[job_id] == entry.decode()


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

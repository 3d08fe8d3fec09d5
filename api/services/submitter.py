"""POST /jobs with group commit: one writer thread inserts the rows of every submission
waiting, enqueues them in one Redis round trip and commits once; a client that got an
error has no job, now or later. See docs/jobs.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry
from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob
from rq.job import JobStatus as RQStatus
from rq.serializers import JSONSerializer
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import Database, Job
from core.errors import DatasetGone, QuotaExceeded, Unavailable
from core.labels import Labels
from core.queue import enqueue_jobs
from core.quotas import JobQuotas
from core.spec import JobSpec, user_dataset_id
from core.store import insert_jobs, new_job
from core.store.deletion import lock_datasets
from core.store.idempotency import by_idempotency_key

MAX_BATCH = 256
COMMIT_CHECKS, COMMIT_CHECK_PAUSE_S = 5, 0.2  # asking whether a failed commit took effect
Outcome = tuple[Job, bool]  # the job, and whether this submission created it
How = Literal["new", "found", "again", "refused"]  # refused: over quota, or its set deleted
log = logging.getLogger("trainq.api")


class OutcomeUnknown(Unavailable):
    """The commit of a submission failed as far as the API can tell, and the database could
    not say whether it took effect: the job may exist. A 503 with Retry-After (api.errors)."""


@dataclass(frozen=True)
class Planned:
    """What the batch does for one submission: a new job, one found by its Idempotency-Key,
    the job of an earlier submission of this batch with the same key, or a refusal."""

    how: How
    job: Job | None = None
    refusal: QuotaExceeded | DatasetGone | None = None

    def outcome(self, failure: Exception | None) -> Outcome | BaseException:
        """What its client is told; `failure`: the batch's new rows were not committed."""
        if self.refusal is not None:
            return self.refusal
        assert self.job is not None
        if failure is None:
            return self.job, self.how == "new"
        # A job found by its key was committed long before.
        return (self.job, False) if self.how == "found" else failure


@dataclass
class Submission:
    spec: JobSpec
    owner: str | None
    idempotency_key: str | None
    quota_owner: str | None  # whose quotas bind it (api.auth.Caller.quota_owner)
    loop: asyncio.AbstractEventLoop
    labels: Labels = field(default_factory=Labels)
    future: asyncio.Future[Outcome] = field(init=False)

    def __post_init__(self) -> None:
        self.future = self.loop.create_future()

    def settle(self, outcome: Outcome | BaseException) -> None:
        """From the writer thread: hand the outcome to the waiting request's event loop."""
        self.loop.call_soon_threadsafe(_settle, self.future, outcome)


def _settle(future: asyncio.Future[Outcome], outcome: Outcome | BaseException) -> None:
    if future.done():  # the client went away and the request was cancelled
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class Submitter:
    def __init__(self, db: Database, redis_url: str, settings: Settings) -> None:
        self._db = db
        self._enqueuer = enqueue_client(redis_url, settings.submit_redis_timeout_s)
        self._settings = settings
        self._pending: deque[Submission] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="trainq-submit", daemon=True)
        self._thread.start()

    async def submit(
        self,
        spec: JobSpec,
        *,
        owner: str | None,
        idempotency_key: str | None,
        quota_owner: str | None,
        labels: Labels | None = None,
    ) -> Outcome:
        """The new job, or with an Idempotency-Key already used by this owner, the job made
        then, its labels as they are (the caller compares the specs). Raises QuotaExceeded
        past a limit of `quota_owner`'s (None: no limits)."""
        loop = asyncio.get_running_loop()
        sub = Submission(spec, owner, idempotency_key, quota_owner, loop, labels or Labels())
        with self._wake:
            if self._closing:
                raise RuntimeError("the API is shutting down")
            self._pending.append(sub)
            self._wake.notify()
        return await sub.future

    def close(self) -> None:
        """Finish what is pending, then stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()
        self._enqueuer.close()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closing:
                    self._wake.wait()
                if not self._pending:
                    return
                batch = [self._pending.popleft() for _ in range(min(MAX_BATCH, len(self._pending)))]
            try:
                outcomes = self._write(batch)
            except IntegrityError:
                # Another API process used one of these Idempotency-Keys between our look-up
                # and our insert: one at a time, so each finds its own answer.
                outcomes = [self._write_one(sub) for sub in batch]
            except Exception as e:  # the database is away: every submission gets the error
                outcomes = [e] * len(batch)
            for sub, outcome in zip(batch, outcomes, strict=True):
                sub.settle(outcome)

    def _write_one(self, sub: Submission) -> Outcome | BaseException:
        try:
            return self._write([sub])[0]
        except Exception as e:
            return e

    def _write(self, batch: list[Submission]) -> list[Outcome | BaseException]:
        plan: list[Planned] = []
        with self._db.manual_session() as s:  # closing it rolls back what was not committed
            try:
                plan = _plan(s, batch, JobQuotas(s, self._settings, _limited(batch)))
                new = [p.job for p in plan if p.how == "new" and p.job is not None]
                if new:
                    insert_jobs(s, jobs=new)
                    # Before the commit: a failed enqueue rolls the rows back, and a
                    # worker handed an entry waits for its row (worker.tasks).
                    enqueue_jobs(
                        self._enqueuer,
                        queue=self._settings.queue,
                        jobs=[(job.id, job.spec, job.owner) for job in new],
                        timeout_s=self._settings.job_timeout_s,
                    )
                backend = _backend(s)
            except IntegrityError:
                raise  # _run retries one at a time
            except Exception as e:
                if not plan:
                    raise  # the database is away: every submission gets the error
                return [p.outcome(e) for p in plan]  # nothing of this batch was committed
            try:
                s.commit()
            except Exception as e:
                with contextlib.suppress(Exception):  # its connection may be gone
                    s.rollback()
                return self._after_failed_commit(plan, backend, e)
        return [p.outcome(None) for p in plan]

    def _after_failed_commit(
        self, plan: list[Planned], backend: int | None, e: Exception
    ) -> list[Outcome | BaseException]:
        new = [p.job.id for p in plan if p.how == "new" and p.job is not None]
        if not new:  # it held only reads
            return [p.outcome(None) for p in plan]
        committed = _committed(self._db, new, backend)
        if committed:
            log.warning("a commit of %d jobs reported %s, yet it took effect", len(new), e)
            return [p.outcome(None) for p in plan]
        if committed is None:
            log.warning(
                "a commit of %d jobs reported %s; whether it took effect is unknown", len(new), e
            )
            failure: Exception = OutcomeUnknown(
                "the database did not confirm the job's creation and could not be asked "
                "whether it happened: the job may exist. Retry with the same Idempotency-Key "
                "(a retry without one may create a second job)"
            )
        else:
            _withdraw(self._enqueuer, new)
            failure = e
        return [p.outcome(failure) for p in plan]


def _limited(batch: list[Submission]) -> set[str]:
    return {sub.quota_owner for sub in batch if sub.quota_owner is not None}


def _plan(s: Session, batch: list[Submission], quotas: JobQuotas) -> list[Planned]:
    """What to do for each submission (Planned), in order: a quota counts the new jobs
    planned before it."""
    plan: list[Planned] = []
    made: dict[tuple[str | None, str], Job] = {}
    for sub in batch:
        key = (sub.owner, sub.idempotency_key or "")
        if sub.idempotency_key is not None and key in made:
            plan.append(Planned("again", made[key]))
            continue
        if sub.idempotency_key is not None:
            found = by_idempotency_key(s, Job, owner=sub.owner, key=sub.idempotency_key)
            if found is not None:
                plan.append(Planned("found", found))
                continue
        if sub.quota_owner is not None:
            try:
                quotas.take(sub.quota_owner)
            except QuotaExceeded as refusal:
                plan.append(Planned("refused", refusal=refusal))
                continue
        job = new_job(
            job_id=str(uuid.uuid4()),
            spec=sub.spec,
            owner=sub.owner,
            idempotency_key=sub.idempotency_key,
            labels=sub.labels,
        )
        if sub.idempotency_key is not None:
            made[key] = job
        plan.append(Planned("new", job))
    return _held_datasets(s, plan)


def _held_datasets(s: Session, plan: list[Planned]) -> list[Planned]:
    """The new jobs' uploaded data sets, held against deletion until the commit; a job whose
    set was deleted since the route looked it up is refused (DatasetGone), not a row."""
    new = [p.job for p in plan if p.how == "new" and p.job is not None]
    named = {job.id: user_dataset_id(job.spec["dataset"]) for job in new}
    present = lock_datasets(s, dataset_ids=[d for d in named.values() if d is not None])

    gone = {
        job.id: DatasetGone(f"no data set {job.spec['dataset']!r}: it was deleted")
        for job in new
        if named[job.id] is not None and named[job.id] not in present
    }

    def held(p: Planned) -> Planned:
        # A submission sent again with the same key in this batch ("again") shares the
        # refusal of the one it repeats: its job is never written either.
        if p.how in ("new", "again") and p.job is not None and p.job.id in gone:
            return Planned("refused", refusal=gone[p.job.id])
        return p

    return [held(p) for p in plan]


def _backend(s: Session) -> int | None:
    """The server process holding this session's transaction (PostgreSQL); None where the
    transaction lives in this process (SQLite)."""
    if s.get_bind().dialect.name != "postgresql":
        return None
    raw: Any = s.connection().connection.dbapi_connection
    return int(raw.info.backend_pid)


def _committed(db: Database, job_ids: list[str], backend: int | None) -> bool | None:
    """Whether a commit of these rows that reported an error took effect: True, False (it
    surely did not) or None (unknown). Rolled back here, a local transaction is settled at
    once; on a server it is settled once its session is gone (a COMMIT still running there
    may yet land), so that is asked first, then whether the rows are there."""
    for i in range(COMMIT_CHECKS):
        if i:
            time.sleep(COMMIT_CHECK_PAUSE_S)
        try:
            with db.reader() as s:
                settled = backend is None or not _session_alive(s, backend)
                found = s.scalars(select(Job.id).where(Job.id.in_(job_ids))).first()
        except SQLAlchemyError:
            continue  # the database is away again: ask again
        if found is not None:
            return True  # one transaction: all of its rows are there, or none
        if settled:
            return False
    return None


def _session_alive(s: Session, backend: int) -> bool:
    alive = s.scalar(
        text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": backend}
    )
    return bool(alive)


def _withdraw(r: Redis, job_ids: list[str]) -> None:
    """Take back the entries of jobs that surely were not committed. One a worker has taken
    already is left to it: it waits for the row, then refuses the entry."""
    for job_id in job_ids:
        try:
            entry = RQJob.fetch(job_id, connection=r, serializer=JSONSerializer)
            if entry.get_status() == RQStatus.QUEUED:
                entry.delete()
        except NoSuchJobError:
            continue
        except RedisError as e:
            log.warning("queue entry %s not taken back (%s); its worker will refuse it", job_id, e)


def enqueue_client(redis_url: str, timeout_s: float) -> Redis:
    """Every wait bounded by `timeout_s`, and one retry: the enqueue runs inside the jobs'
    database transaction, which on SQLite holds the one write lock that every worker's
    heartbeat also needs."""
    return Redis.from_url(
        redis_url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=30,
    )

"""POST /jobs with group commit. Each submission is handed to one writer thread, which takes
every submission waiting at that moment and, for all of them together, inserts the rows in
one transaction and then puts the queue entries on the queue in one Redis round trip. Under
load that is one commit and one round trip for tens of jobs; alone, a submission waits for
no one. The order of events per job is the one a single submission has: the row is
committed before any worker can see the queue entry, and a job whose entry could not be
queued is deleted again (the caller gets the error), so nothing is ever half-written."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field

from redis import Redis
from sqlalchemy.exc import IntegrityError

from core.config import Settings
from core.db import Database, Job
from core.queue import enqueue_jobs
from core.spec import JobSpec
from core.store import delete_jobs, find_by_idempotency_key, insert_jobs, new_job

MAX_BATCH = 256
Outcome = tuple[Job, bool]  # the job, and whether this submission created it


@dataclass
class Submission:
    spec: JobSpec
    owner: str | None
    idempotency_key: str | None
    loop: asyncio.AbstractEventLoop
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
    def __init__(self, db: Database, r: Redis, settings: Settings) -> None:
        self._db = db
        self._r = r
        self._settings = settings
        self._pending: deque[Submission] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="trainq-submit", daemon=True)
        self._thread.start()

    async def submit(
        self, spec: JobSpec, *, owner: str | None, idempotency_key: str | None
    ) -> Outcome:
        """The new job, or with an Idempotency-Key already used by this owner, the job made
        then (the caller compares the specs)."""
        sub = Submission(spec, owner, idempotency_key, asyncio.get_running_loop())
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
        # Per submission: a new job, one found by its Idempotency-Key, or the job of an
        # earlier submission of this batch with the same key.
        plan: list[tuple[str, Job]] = []
        made: dict[tuple[str | None, str], Job] = {}
        with self._db.session() as s:
            for sub in batch:
                key = (sub.owner, sub.idempotency_key or "")
                if sub.idempotency_key is not None and key in made:
                    plan.append(("again", made[key]))
                    continue
                if sub.idempotency_key is not None:
                    found = find_by_idempotency_key(s, owner=sub.owner, key=sub.idempotency_key)
                    if found is not None:
                        plan.append(("found", found))
                        continue
                job = new_job(
                    job_id=str(uuid.uuid4()),
                    spec=sub.spec,
                    owner=sub.owner,
                    idempotency_key=sub.idempotency_key,
                )
                if sub.idempotency_key is not None:
                    made[key] = job
                plan.append(("new", job))
            new = [job for how, job in plan if how == "new"]
            if new:
                insert_jobs(s, jobs=new)
        failed: Exception | None = None
        if new:
            try:
                enqueue_jobs(
                    self._r,
                    queue=self._settings.queue,
                    jobs=[(job.id, job.spec, job.owner) for job in new],
                    timeout_s=self._settings.job_timeout_s,
                )
            except Exception as e:
                # Without its queue entry a job must not exist either.
                with self._db.session() as s:
                    delete_jobs(s, job_ids=[job.id for job in new])
                failed = e
        return [
            (job, how == "new") if how == "found" or failed is None else failed for how, job in plan
        ]

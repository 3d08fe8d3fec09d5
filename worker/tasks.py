"""The RQ job function. Its import path, `worker.tasks.train`, is part of the queue contract
(core.queue): keep it stable. See docs/jobs.md."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from rq import get_current_job

from core.config import Settings
from core.db import Database
from core.spec import JobSpec
from core.store import get_job
from core.sweeps.trials import advance
from worker.admission import admit
from worker.attempt import Attempt, claim
from worker.execution import execute
from worker.logs import current_job
from worker.preemption import Preemption

log = logging.getLogger("trainq.worker")


def train(
    spec: Any, owner: str | None = None, job_id: str | None = None, via: str | None = None
) -> dict[str, Any]:
    """Run one training job: validate, claim, train (resuming from the last checkpoint),
    store the results. Every outcome ends in the job row; nothing is retried by RQ.

    `job_id` is given only when the queue entry's id is not the job's own (a requeue).
    `via="api"`: the API enqueued it before committing its row (core.queue.VIA_API)."""
    rq_job = get_current_job()
    if rq_job is None:
        raise RuntimeError("worker.tasks.train runs inside an RQ worker")
    settings = Settings()
    db = Database.from_settings(settings)
    current_job.set(job_id or rq_job.id)
    try:
        with Preemption() as preemption:  # SIGTERM from worker.rq_worker: hand the job back
            attempt = Attempt(
                job_id=job_id or rq_job.id,
                queue_entry=rq_job.id,
                raw_spec=spec,
                owner=owner,
                via=via,
                worker=rq_job.worker_name or "?",
                settings=settings,
                db=db,
                r=rq_job.connection,
                stop_asked=preemption.asked,
            )
            return _run(attempt)
    finally:
        db.dispose()


def _run(a: Attempt) -> dict[str, Any]:
    spec = admit(a)
    if not isinstance(spec, JobSpec):
        _after_refusal(a)
        return spec  # refused
    claimed = claim(a)
    if claimed is None:
        return {"status": "skipped"}
    outcome = execute(dataclasses.replace(a, number=claimed.job.attempt), spec, claimed)
    if claimed.job.sweep_id is not None:
        _next_trials(a, claimed.job.sweep_id)
    return outcome


def _after_refusal(a: Attempt) -> None:
    """A trial refused at admission (its spec cannot run here) ended failed: the next one."""
    try:
        with a.db.reader() as s:
            job = get_job(s, job_id=a.job_id)
            sweep_id = job.sweep_id if job is not None else None
    except Exception:  # the database away: the reconciler's pass tops the sweep up
        return
    if sweep_id is not None:
        _next_trials(a, sweep_id)


def _next_trials(a: Attempt, sweep_id: str) -> None:
    """A trial ended (or went back to the queue): its sweep's next ones, now. Should this
    fail or the worker die first, the reconciler's next pass makes them."""
    try:
        advance(a.db, a.r, a.settings, sweep_id=sweep_id)
    except Exception:
        log.exception("sweep %s: the next trials wait for the reconciler", sweep_id)

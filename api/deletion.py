"""DELETE of a job: its queue entries first, then its rows in one transaction, then its
stream keys, in the order that makes a crash harmless. See docs/jobs.md."""

from __future__ import annotations

import logging

from redis import Redis
from redis.exceptions import RedisError

from api.services.registry import not_while_registered
from core.db import Database, Job
from core.errors import JobActive
from core.queue import remove_entries
from core.spec import JobStatus
from core.store.deletion import delete_ended_job
from core.store.sweeps import SweepStatus, get_sweep
from core.stream import forget_job

log = logging.getLogger("trainq.deletion")


def entry_ids(job: Job) -> list[str]:
    """Every queue entry trainq may have made for the job: its own id, the one its row
    names, and those of its attempts' requeues (worker.reconciler: -a<n>; a stopping
    worker's hand-back: -p<n>; a retry: -r<n>). A re-enqueue of a waiting job (-q<random>)
    is known by the row alone, and only the latest could still be queued."""
    ids = [job.id, *([job.queue_entry] if job.queue_entry else [])]
    for n in range(1, job.attempt + 2):
        ids += [f"{job.id}-a{n}", f"{job.id}-p{n}", f"{job.id}-r{n}"]
    return list(dict.fromkeys(ids))


def delete_job(db: Database, r: Redis, *, queue: str, job: Job) -> None:
    """Delete the ended `job` (its row as read) and everything of it; JobActive while it is
    queued or running, JobRegistered while it is a registered model's version (also checked
    again in the deletion's transaction). RedisError before the database is touched:
    nothing is deleted."""
    if not JobStatus(job.status).terminal:
        raise JobActive(
            f"job {job.id} is {job.status}: cancel it first (POST /jobs/{job.id}/cancel)"
        )
    if job.sweep_id is not None:
        _not_while_its_sweep_runs(db, job)
    with db.reader() as s:
        not_while_registered(s, job)
    remove_entries(r, queue=queue, entry_ids=entry_ids(job))
    with db.writer() as s:
        if not delete_ended_job(s, job_id=job.id):
            return  # deleted meanwhile by another request (an ended job stays ended)
    try:
        forget_job(r, job.id)
    except RedisError as e:
        log.warning("job %s deleted; its stream was not (%s): it expires within an hour", job.id, e)


def _not_while_its_sweep_runs(db: Database, job: Job) -> None:
    """A running sweep's search reads every trial it made (a grid would ask a deleted
    trial's point again): its trials stay until it ends."""
    with db.reader() as s:
        sweep = get_sweep(s, sweep_id=str(job.sweep_id))
    if sweep is not None and sweep.status == SweepStatus.running:
        raise JobActive(
            f"job {job.id} is trial {job.trial_number} of sweep {sweep.id}, which still runs "
            f"and searches from its trials: delete it once the sweep has ended, or cancel the "
            f"sweep first (POST /sweeps/{sweep.id}/cancel)"
        )

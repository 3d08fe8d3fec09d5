"""The queue contract: how a job reaches a worker. Other services rely on these names:

    Queue("trainq", connection=r, serializer=JSONSerializer).enqueue(
        "worker.tasks.train", spec={...}, job_id=str(uuid4()))

The payload is JSON (never pickle): whoever can write to the queue cannot run code on a GPU
host. An optional `owner` keyword names the API key's owner; without it the job belongs to
the admins."""

from __future__ import annotations

from typing import Any

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

TASK = "worker.tasks.train"
RESULT_TTL_S = 3600
FAILURE_TTL_S = 7 * 24 * 3600


def job_queue(r: Redis, name: str) -> Queue:
    return Queue(name, connection=r, serializer=JSONSerializer)


def enqueue_job(
    r: Redis,
    *,
    queue: str,
    job_id: str,
    spec: dict[str, Any],
    owner: str | None,
    timeout_s: int,
    queue_entry: str | None = None,
) -> None:
    """Put a job on the queue. A requeued job travels under a new queue entry id (RQ keeps
    the old entry's history) and names its trainq job in the payload."""
    kwargs = _payload(spec, owner)
    if queue_entry is not None and queue_entry != job_id:
        kwargs["job_id"] = job_id
    job_queue(r, queue).enqueue_call(
        TASK,
        kwargs=kwargs,
        job_id=queue_entry or job_id,
        timeout=timeout_s,
        result_ttl=RESULT_TTL_S,
        failure_ttl=FAILURE_TTL_S,
        description=f"trainq job {job_id}",
    )


def enqueue_jobs(
    r: Redis, *, queue: str, jobs: list[tuple[str, dict[str, Any], str | None]], timeout_s: int
) -> None:
    """Put new jobs (job id, spec, owner) on the queue in one round trip (a MULTI/EXEC)."""
    q = job_queue(r, queue)
    q.enqueue_many(
        [
            Queue.prepare_data(
                TASK,
                kwargs=_payload(spec, owner),
                job_id=job_id,
                timeout=timeout_s,
                result_ttl=RESULT_TTL_S,
                failure_ttl=FAILURE_TTL_S,
                description=f"trainq job {job_id}",
            )
            for job_id, spec, owner in jobs
        ]
    )


def _payload(spec: dict[str, Any], owner: str | None) -> dict[str, Any]:
    return {"spec": spec} if owner is None else {"spec": spec, "owner": owner}


def entry_is_live(r: Redis, queue_entry: str) -> bool:
    """Whether the queue still holds this entry, waiting or being worked on."""
    from rq.exceptions import NoSuchJobError
    from rq.job import Job as RQJob
    from rq.job import JobStatus as RQStatus

    try:
        status = RQJob.fetch(queue_entry, connection=r, serializer=JSONSerializer).get_status()
    except NoSuchJobError:
        return False
    return status in (RQStatus.QUEUED, RQStatus.STARTED, RQStatus.DEFERRED, RQStatus.SCHEDULED)


def stop_entry(r: Redis, queue_entry: str) -> bool:
    """RQ's stop command: the worker running this entry kills its work horse. The fallback
    for a job that no longer answers (a cooperative cancel is checked between steps)."""
    from rq.command import send_stop_job_command
    from rq.exceptions import InvalidJobOperation, NoSuchJobError

    try:
        send_stop_job_command(r, queue_entry, serializer=JSONSerializer)
    except (InvalidJobOperation, NoSuchJobError):
        return False
    return True

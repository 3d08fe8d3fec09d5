"""The queue contract: how a job reaches a worker (`worker.tasks.train`, a JSON payload
that other services may enqueue too), and the one place that puts a job row on the queue
(`enqueue_row`, `enqueue_or_leave`). See docs/jobs.md."""

from __future__ import annotations

import logging
import re
import uuid
from typing import TYPE_CHECKING, Any

from redis import Redis
from redis.exceptions import RedisError
from rq import Queue
from rq.executions import ExecutionRegistry
from rq.job import Job as RQJob
from rq.results import Result
from rq.serializers import JSONSerializer

if TYPE_CHECKING:
    from core.config import Settings
    from core.db import Job

log = logging.getLogger("trainq.queue")
TASK = "worker.tasks.train"
RESULT_TTL_S = 3600
FAILURE_TTL_S = 7 * 24 * 3600
PAYLOAD_KEYS = frozenset({"spec", "owner", "job_id", "via"})
MAX_PAYLOAD_BYTES = 32 * 1024  # the spec's bound and room for the rest; read before parsing
MAX_SPEC_BYTES = 16 * 1024  # a real spec is a few hundred bytes
MAX_SPEC_DEPTH = 4  # a JobSpec is flat: depth 1
MAX_OWNER_CHARS = 200
ENTRY_SUFFIX = re.compile(r"[a-z0-9]{1,16}")
MAX_FIELDS = 64  # RQ writes about 30
MAX_FIELD_NAME_BYTES = 64
# RQ's default description is the call string, the whole spec in it: a few times 16 KiB
MAX_FIELD_BYTES = 64 * 1024


def is_uuid(value: object) -> bool:
    """A UUID in its canonical form, as str(uuid4()) writes it."""
    if not isinstance(value, str):
        return False
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def job_id_of(entry: bytes) -> str | None:
    """The trainq job an entry id names by the contract (`<uuid>` or `<uuid>-<suffix>`), or
    None for an id that names none (a worker drops or refuses its entry)."""
    try:
        text = entry.decode()
    except UnicodeDecodeError:
        return None
    head = text[:36]
    if is_uuid(head) and (len(text) == 36 or text[36] == "-"):
        return head
    return None


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


def enqueue_row(r: Redis, settings: Settings, job: Job, entry: str | None = None) -> None:
    """The job row's spec and owner onto the queue under `entry` (None: the job's own id),
    which the row names already."""
    enqueue_job(
        r,
        queue=settings.queue,
        job_id=job.id,
        spec=job.spec,
        owner=job.owner,
        timeout_s=settings.job_timeout_s,
        queue_entry=entry,
    )


def enqueue_or_leave(
    r: Redis, settings: Settings, job: Job, entry: str | None, *, what: str
) -> bool:
    """A queued row onto the queue (enqueue_row), or, with Redis away, left to the
    reconciler, which enqueues a queued job with no live entry after its grace: logged, and
    False. `what` says how the row came to be queued, for the log."""
    try:
        enqueue_row(r, settings, job, entry)
    except RedisError as e:
        log.warning("job %s: %s, but not enqueued (%s); the reconciler will", job.id, what, e)
        return False
    return True


def enqueue_jobs(
    r: Redis, *, queue: str, jobs: list[tuple[str, dict[str, Any], str | None]], timeout_s: int
) -> None:
    """Put new jobs (job id, spec, owner) on the queue in one round trip (a MULTI/EXEC)."""
    q = job_queue(r, queue)
    q.enqueue_many(
        [
            Queue.prepare_data(
                TASK,
                kwargs=_payload(spec, owner, via=VIA_API),
                job_id=job_id,
                timeout=timeout_s,
                result_ttl=RESULT_TTL_S,
                failure_ttl=FAILURE_TTL_S,
                description=f"trainq job {job_id}",
            )
            for job_id, spec, owner in jobs
        ]
    )


# The API enqueues new jobs inside the transaction that inserts their rows, and commits
# after: a worker handed an entry marked so waits a moment for the row, and refuses the
# entry if it never comes (the submission failed and its client got an error).
VIA_API = "api"


def _payload(spec: dict[str, Any], owner: str | None, via: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"spec": spec} if owner is None else {"spec": spec, "owner": owner}
    if via is not None:
        payload["via"] = via
    return payload


def remove_entries(r: Redis, *, queue: str, entry_ids: list[str]) -> None:
    """Take these entries off the queue, out of RQ's registries, and their hashes and
    results out of Redis, in one round trip. Never reads an entry (it may be anyone's junk);
    an id with no entry costs nothing. What a worker still finishing an entry writes after
    this (its result, for RESULT_TTL_S) expires."""
    q = job_queue(r, queue)
    # RQ's started registry is keyed by execution and removes nothing by id; an ended job's
    # execution is gone from it already.
    registries = [
        q.finished_job_registry,
        q.failed_job_registry,
        q.canceled_job_registry,
        q.deferred_job_registry,
        q.scheduled_job_registry,
    ]
    with r.pipeline(transaction=False) as pipe:
        for entry in entry_ids:
            q.remove(entry, pipeline=pipe)
            # Taken by a worker that died before it started it: RQ would put it back.
            pipe.lrem(q.intermediate_queue_key, 0, entry)
            for registry in registries:
                registry.remove(entry, pipeline=pipe)
            executions = ExecutionRegistry(job_id=entry, connection=r).key
            pipe.delete(RQJob.key_for(entry), Result.get_key(entry), executions)
        pipe.execute()

"""Queue entries as a trainq worker reads them: RQ's job and queue classes, bound to the
queue contract (core.queue), and the removal of entries and ids RQ cannot read. Importing
it loads the job function (worker.tasks) before a worker forks a work horse. See
docs/jobs.md."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from redis import Redis
from rq import Queue, worker_registration
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job, parse_job_id, validate_job_id

import worker.tasks
from core.queue import FAILURE_TTL_S, MAX_FIELD_BYTES, MAX_PAYLOAD_BYTES, RESULT_TTL_S, TASK
from worker.entry_checks import QueueEntry, UnreadableEntry, inflate, read_entry

log = logging.getLogger("trainq.worker")


class TrainqJob(Job):
    """A queue entry as a trainq worker holds it: whatever names it carries, it calls
    worker.tasks.train and nothing else, imports no callback and calls no webhook. RQ would
    otherwise import and call a producer's failure callback even while it cleans up an
    abandoned entry, outside any job this worker chose to run.

    It reads an entry only within the bounds of core.queue, and drops one it cannot read
    (UnreadableEntry, a NoSuchJobError): RQ's dequeue then takes the next entry, and RQ's
    maintenance drops the id from its lists, as for an entry that is gone."""

    @classmethod
    def fetch(cls, id: str, connection: Redis | None = None, serializer: Any = None) -> TrainqJob:
        if connection is None:
            raise TypeError("a trainq worker fetches entries through its own connection")
        name = id  # until RQ's job id is read out of it
        try:
            job = cls(_job_id(id), connection=connection, serializer=serializer)
            name = job.id
            job.refresh()
        except UnreadableEntry as e:
            drop_entry(connection, name, str(e))
            raise
        return job

    def refresh(self) -> None:
        fields = read_entry(self.connection, self.key)
        if not fields:
            raise NoSuchJobError(f"No such job: {self.key}")
        try:
            self.restore(fields)
        except UnreadableEntry:
            raise
        except Exception as e:  # restore parses a producer's bytes: any failure is theirs
            raise UnreadableEntry(f"RQ cannot restore it: {type(e).__name__}: {e}"[:300]) from e

    def restore(self, raw_data: dict[bytes, bytes]) -> None:
        """RQ's restore, but RQ inflates `data` and `exc_info` whole: here neither inflates
        past its bound."""
        fields = dict(raw_data)
        if len(inflate(fields.get(b"exc_info", b""), MAX_FIELD_BYTES)) > MAX_FIELD_BYTES:
            raise UnreadableEntry(f"its exc_info inflates past {MAX_FIELD_BYTES} bytes")
        payload = inflate(fields.get(b"data", b""), MAX_PAYLOAD_BYTES)
        oversized = len(payload) > MAX_PAYLOAD_BYTES
        if oversized:
            fields[b"data"] = b""  # not zlib: RQ takes it as it is and inflates nothing
        super().restore(fields)
        if oversized:
            self.data = payload  # cut one byte past the bound: the contract refuses it
        # The worker's own, not the entry's (timeout too: TrainqWorker.execute_job). RQ
        # writes its defaults (a 180 s timeout) into every entry enqueued without them, so
        # refusing other values would turn away the documented producer, and how long a GPU
        # and Redis hold a job is the host's to decide. `ttl` is left: it bounds only the
        # wait on the queue, and RQ persists an entry's key once it starts.
        self.result_ttl, self.failure_ttl = RESULT_TTL_S, FAILURE_TTL_S

    @property
    def func(self) -> Callable[..., Any]:
        if self.func_name != TASK:
            raise InvalidJobOperation(f"only {TASK} runs on a trainq worker")
        return worker.tasks.train

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None

    def send_webhooks(self, status: str, *, exc_string: str | None = None) -> None:
        return None


def _job_id(entry: str) -> str:
    """The job id RQ reads out of an entry id, when RQ names jobs so."""
    try:
        job_id = parse_job_id(entry)
        validate_job_id(job_id)
    except (TypeError, ValueError) as e:
        raise UnreadableEntry(f"its id names no RQ job: {e}") from e
    return job_id


def drop_entry(r: Redis, entry: str | bytes, reason: str) -> None:
    """An entry RQ cannot restore cannot be failed in RQ either: its hash is deleted, so that
    no worker meets it again, and the log names it."""
    log.error("dropped queue entry %.100r: %s", entry, reason)
    raw = entry if isinstance(entry, bytes) else entry.encode()
    r.delete(Job.redis_job_namespace_prefix.encode() + raw)


def id_problem(raw: bytes) -> str | None:
    """Why RQ could not look up the entry of a popped id, or None."""
    try:
        _job_id(raw.decode())
    except UnicodeDecodeError:
        return "its id is not UTF-8"
    except UnreadableEntry as e:
        return str(e)
    return None


class TrainqQueue(Queue):
    """RQ's queue, popping on past an id that RQ names no job by: RQ would raise on it
    inside the worker's dequeue (a decode, or Job's id check), before it reads any entry."""

    @classmethod
    def lmove(cls, connection: Redis, queue_key: str, timeout: int | None) -> Any:
        while True:
            popped = super().lmove(connection, queue_key, timeout)
            problem = None if popped is None else id_problem(popped[1])
            if problem is None:
                return popped
            connection.lrem(IntermediateQueue.get_intermediate_queue_key(queue_key), 1, popped[1])
            drop_entry(connection, popped[1], problem)

    @classmethod
    def lpop(
        cls, queue_keys: Sequence[str], timeout: int | None, connection: Redis | None = None
    ) -> Any:
        while True:
            popped = super().lpop(queue_keys, timeout, connection=connection)
            problem = None if popped is None else id_problem(popped[1])
            if problem is None or connection is None:
                return popped
            drop_entry(connection, popped[1], problem)


def drop_junk_ids(r: Redis, queue: Queue) -> None:
    """Ids RQ names no job by, removed from the queue's registries and intermediate list."""
    registries = (
        queue.started_job_registry,
        queue.failed_job_registry,
        queue.finished_job_registry,
        queue.deferred_job_registry,
        queue.scheduled_job_registry,
        queue.canceled_job_registry,
    )
    for registry in registries:
        if not _of_type(r, registry.key, "zset"):
            continue
        for member, _ in r.zscan_iter(registry.key):
            if id_problem(member.split(b":", 1)[0]) is not None:
                log.error("dropped %.100r from %s: RQ names no job by it", member, registry.key)
                r.zrem(registry.key, member)
    if not _of_type(r, queue.intermediate_queue_key, "list"):
        return
    listed: list[bytes] = r.lrange(queue.intermediate_queue_key, 0, -1)  # type: ignore[assignment]
    for raw in listed:
        if id_problem(raw) is not None:
            log.error("dropped %.100r from %s: RQ names no job by it", raw, queue.key)
            r.lrem(queue.intermediate_queue_key, 0, raw)  # type: ignore[arg-type]


def drop_wrong_types(r: Redis, queue: str) -> None:
    """The keys RQ writes as a worker starts and waits (its sets of workers and queues, the
    queue's list) deleted where they hold another type: RQ's every command on them would
    fail with WRONGTYPE, and the worker would start again and again, taking no job. None of
    them can hold a job's entry while of the wrong type."""
    for key, kind in (
        (worker_registration.REDIS_WORKER_KEYS, "set"),
        (worker_registration.WORKERS_BY_QUEUE_KEY % queue, "set"),
        (Queue.redis_queues_keys, "set"),
        (Queue.redis_queue_namespace_prefix + queue, "list"),
    ):
        _of_type(r, key, kind)


def _of_type(r: Redis, key: str, kind: str) -> bool:
    """True when `key` holds a `kind` or nothing; a key of another type (RQ would fail on
    it with WRONGTYPE at every clean-up) is deleted, and False."""
    found = r.type(key)
    found = found.decode() if isinstance(found, bytes) else str(found)
    if found in (kind, "none"):
        return found == kind
    log.error("deleted %s: a %r where RQ keeps a %s", key, found, kind)
    r.delete(key)
    return False


def queue_entry(job: Job) -> QueueEntry:
    """What the producer stored, read without deserialising or importing any of it (the
    callback properties would import the callbacks; RQ has no public name for them)."""
    names = (job._success_callback_name, job._failure_callback_name, job._stopped_callback_name)
    return QueueEntry(
        id=job.id,
        payload=job.data,
        callbacks=tuple(n for n in names if n),
        webhooks=len(job.webhooks),
        dependencies=tuple(job._dependency_ids),
        retries=job.retries_left or 0,
        repeats=job.repeats_left or 0,
    )

"""The queue contract: how a job reaches a worker. Other services rely on these names:

    Queue("trainq", connection=r, serializer=JSONSerializer).enqueue(
        "worker.tasks.train", spec={...}, job_id=str(uuid4()))

The payload is JSON (never pickle), and the queue is an API like HTTP: whoever can write to
it cannot run code on a GPU host. A worker runs an entry only if `contract_violation` finds
nothing wrong with it:

- the function is exactly `worker.tasks.train`, called without an instance, and the entry
  names no callback (on_success, on_failure, on_stopped), webhook, dependency, RQ retry or
  repeat;
- no positional arguments; the keywords are `spec` (a JSON object, at most 16 KiB as
  compact JSON and 4 levels deep), `owner` (1 to 200 characters; absent or None: the job
  belongs to the admins), `job_id` (a requeue's job, a canonical UUID) and `via` ("api");
- the entry id is the job id (a canonical UUID), or the job id, "-" and a suffix of up to
  16 characters of [a-z0-9] (`<uuid>-a2`, `<uuid>-q1f2e3d4c`: a requeue, which then names
  its job in `job_id`).

A refused entry is failed in RQ (its FailedJobRegistry, with the reason) and nothing of it
runs: no import, no call, no trainq job row. The check reads only what RQ stored, so it
imports nothing a producer names.

Before that, a worker reads an entry only within bounds, so that no entry can stop it or
fill its memory:

- the entry's hash has at most 64 fields, with names of at most 64 bytes and values of at
  most 64 KiB, checked inside Redis (`read_entry`, one script) before any of it is read;
  `data` is inflated no further than 32 KiB (a longer payload is refused as above);
- an entry that breaks these bounds, or that RQ cannot restore (a junk date or status, a
  field or id that is not UTF-8, an id RQ names no job by, no `data`, a key that is no
  hash), cannot be failed in RQ: it is dropped (its hash deleted, a log line naming it) and
  the worker goes on to the next entry;
- RQ's `timeout`, `result_ttl` and `failure_ttl` are the worker's own (the setting
  `job_timeout_s`, RESULT_TTL_S, FAILURE_TTL_S), whatever the entry says."""

from __future__ import annotations

import json
import re
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.serializers import JSONSerializer

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


@dataclass(frozen=True)
class QueueEntry:
    """What a producer controls about one entry on the queue, as RQ stored it."""

    id: str
    payload: bytes  # RQ's JSON serializer: [function, instance, args, kwargs]
    callbacks: tuple[str, ...] = ()  # the names given as on_success, on_failure, on_stopped
    webhooks: int = 0
    dependencies: tuple[str, ...] = ()
    retries: int = 0
    repeats: int = 0


class UnreadableEntry(NoSuchJobError):
    """An entry that breaks the reading bounds or that RQ cannot restore. A NoSuchJobError:
    every path of RQ's that meets one goes on as it does past an entry that is gone."""


def contract_violation(entry: QueueEntry) -> str | None:
    """Why a worker must not run this entry, or None when it may."""
    if len(entry.payload) > MAX_PAYLOAD_BYTES:
        return f"the payload is over {MAX_PAYLOAD_BYTES} bytes, the most a worker reads"
    try:
        function, instance, args, kwargs = _parse(entry.payload)
    except (ValueError, RecursionError) as e:
        return f"the payload is not RQ's JSON [function, instance, args, kwargs]: {e}"
    if function != TASK:
        return f"only {TASK} runs on a trainq worker, not {_shown(function)}"
    if instance is not None:
        return "a method of an instance is not part of the queue contract"
    return (
        _extras_violation(entry)
        or _args_violation(args, kwargs)
        or _spec_violation(kwargs["spec"])
        or _owner_violation(kwargs.get("owner"))
        or _ids_violation(kwargs.get("job_id"), entry.id)
        or _via_violation(kwargs)
    )


def inflate(raw: bytes, limit: int) -> bytes:
    """A zlib field as RQ's restore reads it (the raw bytes when they are not zlib), but
    inflated to no more than limit + 1 bytes: a result longer than `limit` is cut there, so
    that a small field which would inflate to gigabytes costs the worker no more."""
    try:
        return zlib.decompressobj().decompress(raw, limit + 1)
    except zlib.error:
        return raw


# One script, so the bounds are checked inside Redis and nothing can grow between the check
# and the read. A string reply is the reason the entry was not read.
_READ_ENTRY = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return {} end
if kind ~= 'hash' then return 'its key holds a ' .. kind .. ', not a hash' end
local fields = redis.call('HLEN', KEYS[1])
if fields > tonumber(ARGV[1]) then
  return 'its hash has ' .. fields .. ' fields; at most ' .. ARGV[1] .. ' are read'
end
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if #name > tonumber(ARGV[2]) then
    return 'a field name is ' .. #name .. ' bytes; at most ' .. ARGV[2] .. ' are read'
  end
  local size = redis.call('HSTRLEN', KEYS[1], name)
  if size > tonumber(ARGV[3]) then
    return 'its field ' .. name .. ' is ' .. size .. ' bytes; at most ' .. ARGV[3] .. ' are read'
  end
end
return redis.call('HGETALL', KEYS[1])
"""


def read_entry(r: Redis, key: str) -> dict[bytes, bytes]:
    """An entry's hash, read only within the bounds (empty when there is none); raises
    UnreadableEntry with the reason when it breaks them."""
    bounds = (MAX_FIELDS, MAX_FIELD_NAME_BYTES, MAX_FIELD_BYTES)
    reply = r.register_script(_READ_ENTRY)(keys=[key], args=bounds)
    if isinstance(reply, bytes):
        raise UnreadableEntry(reply.decode(errors="replace"))
    return dict(zip(reply[::2], reply[1::2], strict=True))


def is_uuid(value: object) -> bool:
    """A UUID in its canonical form, as str(uuid4()) writes it."""
    if not isinstance(value, str):
        return False
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _parse(payload: bytes) -> tuple[Any, Any, Any, Any]:
    call = json.loads(payload, parse_constant=_no_constant)
    if not isinstance(call, list) or len(call) != 4:
        raise ValueError("not an array of four")
    return call[0], call[1], call[2], call[3]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _extras_violation(entry: QueueEntry) -> str | None:
    if entry.callbacks:
        return f"callbacks are refused: {_shown(list(entry.callbacks))}"
    if entry.webhooks:
        return "webhooks are refused"
    if entry.dependencies:
        return "dependencies are refused"
    if entry.retries or entry.repeats:
        return "RQ retries and repeats are refused: trainq requeues a lost job itself"
    return None


def _args_violation(args: Any, kwargs: Any) -> str | None:
    if args:
        return "positional arguments are refused: pass spec= (and owner=) by keyword"
    if not isinstance(kwargs, dict):
        return f"the keywords must be a JSON object, not {_json_type(kwargs)}"
    unknown = sorted(set(kwargs) - PAYLOAD_KEYS)
    if unknown:
        return f"unknown keywords {_shown(unknown)}; the contract has {sorted(PAYLOAD_KEYS)}"
    if "spec" not in kwargs:
        return "spec= is missing"
    return None


def _spec_violation(spec: Any) -> str | None:
    if not isinstance(spec, dict):
        return f"spec= must be a JSON object, not {_json_type(spec)}"
    if _depth(spec) > MAX_SPEC_DEPTH:
        return f"spec= nests deeper than {MAX_SPEC_DEPTH} levels"
    size = len(json.dumps(spec, separators=(",", ":")).encode())
    if size > MAX_SPEC_BYTES:
        return f"spec= is {size} bytes as JSON; at most {MAX_SPEC_BYTES}"
    return None


def _owner_violation(owner: Any) -> str | None:
    if owner is None or (isinstance(owner, str) and 1 <= len(owner) <= MAX_OWNER_CHARS):
        return None
    return (
        f"owner= must be a string of 1 to {MAX_OWNER_CHARS} characters, or absent; "
        f"not {_shown(owner) if isinstance(owner, str) else _json_type(owner)}"
    )


def _ids_violation(job_id: Any, entry_id: str) -> str | None:
    if job_id is None:
        if is_uuid(entry_id):
            return None
        return f"the entry id {_shown(entry_id)} is not a UUID, and no job_id= names the job"
    if not is_uuid(job_id):
        return f"job_id= must be a UUID as str(uuid4()) writes it, not {_shown(job_id)}"
    suffix = entry_id.removeprefix(f"{job_id}-")
    if entry_id == job_id or (suffix != entry_id and ENTRY_SUFFIX.fullmatch(suffix)):
        return None
    return f"the entry id {_shown(entry_id)} must be job_id=, or it, '-' and [a-z0-9]{{1,16}}"


def _via_violation(kwargs: dict[str, Any]) -> str | None:
    if "via" not in kwargs or kwargs["via"] == "api":
        return None
    return f"via= is 'api' or absent, not {_shown(kwargs['via'])}"


def _depth(value: Any) -> int:
    """How deep a parsed JSON value nests: an object of numbers and strings is 1."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def _shown(value: Any) -> str:
    """A producer's value in a message, cut short: it may be as long as the payload."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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


# A worker running an entry beats every 5 s (worker.run's job_monitoring_interval): four
# beats missed and it is gone. Judged by Redis's clock against the worker's stamps, so a
# worker host far off may have its live entry's job re-enqueued early; that is safe (only
# one claim of a queued job wins).
WORKER_SILENT_S = 20.0
# The fields read here are short (a status, a worker name, a timestamp): a longer value is
# a Redis writer's, and is read as absent rather than loaded.
MAX_LIVENESS_FIELD_BYTES = 256
LIVE_STATUSES = frozenset({b"queued", b"deferred", b"scheduled"})

# A hash's named fields, each nil when absent or longer than the bound; nothing when the key
# holds no hash. One script, so nothing grows between the length check and the read.
_READ_FIELDS = """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return {} end
local out = {}
for i = 2, #ARGV do
  if redis.call('HSTRLEN', KEYS[1], ARGV[i]) <= tonumber(ARGV[1]) then
    out[i - 1] = redis.call('HGET', KEYS[1], ARGV[i])
  else
    out[i - 1] = false
  end
end
return out
"""


def _read_fields(r: Redis, key: str, names: list[str]) -> list[bytes | None]:
    """The named fields of a hash, read within MAX_LIVENESS_FIELD_BYTES (None for a field
    that is absent or longer, every one None when the key holds no hash)."""
    reply = r.register_script(_READ_FIELDS)(keys=[key], args=[MAX_LIVENESS_FIELD_BYTES, *names])
    values = [v if isinstance(v, bytes) else None for v in reply]
    return values + [None] * (len(names) - len(values))


def entry_is_live(r: Redis, queue_entry: str) -> bool:
    """Whether the queue still holds this entry, waiting or being worked on by a worker
    that is still there. Anyone who can write to Redis can write junk into an entry or a
    worker's hash: what cannot be read is not live, which is safe (a re-enqueue names the
    job's new entry first, and only one claim of a queued job wins)."""
    from rq.job import Job as RQJob

    status, worker = _read_fields(
        r, RQJob.redis_job_namespace_prefix + queue_entry, ["status", "worker_name"]
    )
    if status == b"started":
        return worker is not None and _worker_beats(r, worker)
    return status in LIVE_STATUSES


def _worker_beats(r: Redis, name: bytes) -> bool:
    """Whether an RQ worker is alive: its key holds a recent heartbeat and no death. A
    killed worker leaves its entry STARTED until RQ's own clean-up, ten minutes or more
    later, and its key for a minute or more; its heartbeat stops at once."""
    from rq.utils import utcparse
    from rq.worker import Worker

    try:
        key = Worker.redis_worker_namespace_prefix + name.decode()
    except UnicodeDecodeError:
        return False  # no worker RQ registers has such a name
    beat, death = _read_fields(r, key, ["last_heartbeat", "death"])
    if beat is None or death is not None:
        return False
    try:
        stamped = utcparse(beat.decode())
    except (UnicodeDecodeError, ValueError):
        return False  # junk, not a heartbeat RQ wrote
    seconds, micros = r.time()
    return seconds + micros / 1e6 - stamped.timestamp() < WORKER_SILENT_S


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

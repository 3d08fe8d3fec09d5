"""How a worker reads an entry of the queue (core.queue holds the contract): within the
reading bounds, checked against the contract before anything of it runs; and, for the
reconciler, whether an entry is still live, and RQ's command to stop one.
See docs/queue.md ("The contract")."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer
from rq.utils import utcparse
from rq.worker import Worker

from core.queue import (
    ENTRY_SUFFIX,
    MAX_FIELD_BYTES,
    MAX_FIELD_NAME_BYTES,
    MAX_FIELDS,
    MAX_OWNER_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
    PAYLOAD_KEYS,
    TASK,
    is_uuid,
)


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


# A worker running an entry beats every 5 s (worker.rq_worker's job_monitoring_interval): four
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
    try:
        send_stop_job_command(r, queue_entry, serializer=JSONSerializer)
    except (InvalidJobOperation, NoSuchJobError):
        return False
    return True

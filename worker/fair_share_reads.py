"""What fair share reads about the entries on the queue: the job each entry names, its row
(owner, priority, whether it still waits under that entry), a direct entry's payload, and
the jobs running. See docs/quotas.md."""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from redis import Redis
from rq.job import Job as RQJob
from rq.utils import utcparse
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import Job
from core.queue import MAX_OWNER_CHARS, MAX_PAYLOAD_BYTES
from core.spec import JobStatus, Priority
from worker.entry_checks import UnreadableEntry, inflate, read_entry
from worker.fair_share_order import Owner

ROWS_PER_QUERY = 500  # ids in one IN (...): within SQLite's bound on parameters


class Row(NamedTuple):
    """The few columns of a job's row that fair share reads."""

    id: str
    owner: Owner
    status: str
    queue_entry: str | None
    priority: int
    created_at: dt.datetime  # in UTC


@dataclass(frozen=True)
class Payload:
    """The little of a direct entry that fair share reads: whose it is, and its priority."""

    owner: Owner
    priority: int
    since: dt.datetime


def read_payload(r: Redis, entry: str) -> Payload | None:
    """A direct entry's owner, priority and enqueue time, read within the worker's bounds
    (worker.entry_checks); None when it cannot be read or breaks the contract's shape."""
    try:
        fields = read_entry(r, RQJob.redis_job_namespace_prefix + entry)
    except UnreadableEntry:
        return None
    try:
        _, _, _, kwargs = json.loads(inflate(fields.get(b"data", b""), MAX_PAYLOAD_BYTES))
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(kwargs, dict) or not isinstance(kwargs.get("spec"), dict):
        return None
    owner = kwargs.get("owner")
    if owner is not None and not (isinstance(owner, str) and 1 <= len(owner) <= MAX_OWNER_CHARS):
        return None
    return Payload(owner, _rank(kwargs["spec"].get("priority")), _enqueued_at(fields))


def _rank(value: Any) -> int:
    try:
        return Priority(value).rank if value is not None else Priority.normal.rank
    except ValueError:
        return Priority.normal.rank  # the admission refuses the spec; it competes as normal


def _enqueued_at(fields: Mapping[bytes, bytes]) -> dt.datetime:
    try:
        return utcparse(fields[b"enqueued_at"].decode())
    except (KeyError, UnicodeDecodeError, ValueError):
        return dt.datetime.now(dt.UTC)


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def waits_under(row: Row, entry: str) -> bool:
    """Whether the row is queued and this entry is the one its claim accepts
    (core.store.claim_job)."""
    if row.status != JobStatus.queued:
        return False
    return row.queue_entry == entry or (row.queue_entry is None and entry == row.id)


def job_rows(s: Session, job_ids: set[str]) -> dict[str, Row]:
    ordered = sorted(job_ids)
    out: dict[str, Row] = {}
    for i in range(0, len(ordered), ROWS_PER_QUERY):
        chunk = ordered[i : i + ROWS_PER_QUERY]
        q = select(
            Job.id, Job.owner, Job.status, Job.queue_entry, Job.priority, Job.created_at
        ).where(Job.id.in_(chunk))
        for r in s.execute(q):
            out[r.id] = Row(r.id, r.owner, r.status, r.queue_entry, r.priority, _utc(r.created_at))
    return out


def running_jobs(s: Session) -> dict[Owner, set[str]]:
    running: dict[Owner, set[str]] = defaultdict(set)
    for job_id, owner in s.execute(
        select(Job.id, Job.owner).where(Job.status == JobStatus.running)
    ):
        running[owner].add(job_id)
    return running

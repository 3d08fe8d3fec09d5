"""GET /jobs's search: one owner's jobs (an admin's: everyone's) narrowed by status, tags,
name prefix, data set, architecture, sweep, id prefix and creation time, ordered by creation,
duration or a final figure, a page at a time from where the last page ended (keyset paging:
a deep page costs what the first does). See docs/api.md ("Finding jobs").

How a page is read. Each order has an index that holds it (core.db.tables); walking it
and checking the filters on the way costs the rows passed before the page fills, which is
little while every filter keeps many jobs. A filter that keeps few (a rare tag, a long name
prefix, one sweep, a day) would make that walk cross most of the owner's jobs: when one of
them keeps at most CANDIDATES_MAX jobs, those are read through its own index and sorted
instead. Which one is measured here, with a bounded count on each filter's index, since
SQLite plans without statistics (trainq never runs ANALYZE) and cannot tell a rare tag from a
common one; PostgreSQL, which can, is given the same query, and plans it as it sees fit."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Select, exists, func, literal, select, tuple_
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import InstrumentedAttribute, Session, aliased
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import FunctionElement

from core.db import Job, JobTag
from core.labels import name_key
from core.spec import JobStatus

# The most jobs a filter may keep for a page to be read through that filter's index and
# sorted: past it, a walk of the order's index fills a page after a few thousand rows.
CANDIDATES_MAX = 1000


class SortKey(StrEnum):
    """What GET /jobs orders by: creation, or a figure of the jobs that succeeded."""

    created = "created"
    duration = "duration"  # the result's duration_s: training time
    test_accuracy = "test_accuracy"
    test_loss = "test_loss"
    train_accuracy = "train_accuracy"
    train_loss = "train_loss"
    images_per_second = "images_per_second"

    @property
    def column(self) -> InstrumentedAttribute[Any]:
        if self is SortKey.created:
            return Job.created_at
        name = "duration_s" if self is SortKey.duration else self.value
        return getattr(Job, f"final_{name}")  # type: ignore[no-any-return]

    @property
    def figure(self) -> bool:
        """A figure that only a succeeded job has: jobs without it are not listed."""
        return self is not SortKey.created


@dataclass(frozen=True)
class Sort:
    key: SortKey = SortKey.created
    descending: bool = True

    @classmethod
    def parse(cls, text: str) -> Sort:
        """`-test_accuracy` (descending) or `test_loss` (ascending); ValueError otherwise."""
        return cls(SortKey(text.removeprefix("-")), text.startswith("-"))

    def __str__(self) -> str:
        return f"{'-' if self.descending else ''}{self.key.value}"


@dataclass(frozen=True)
class JobFilters:
    """What every job listed must be: each filter given narrows the listing (all tags)."""

    statuses: tuple[JobStatus, ...] = ()
    tags: tuple[str, ...] = ()
    name_prefix: str | None = None
    dataset: str | None = None
    model: str | None = None
    sweep_id: str | None = None
    id_prefix: str | None = None
    created_after: dt.datetime | None = None  # inclusive
    created_before: dt.datetime | None = None  # exclusive

    def digest(self) -> str:
        """A short hash of the filters: a cursor carries it, so that it is never used with
        other filters."""
        canonical = json.dumps(asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Position:
    """Where a page ended: its last job's sort value and id (ties are ordered by id)."""

    value: float | dt.datetime
    job_id: str


@dataclass(frozen=True)
class Scope:
    """Whose jobs a search reads: one owner's, or everyone's (an admin)."""

    owner: str | None
    everyone: bool


def search_jobs(
    s: Session,
    *,
    scope: Scope,
    filters: JobFilters,
    sort: Sort,
    after: Position | None,
    limit: int,
) -> Sequence[Job]:
    """A page of jobs: `limit` at most, in `sort`'s order, after `after`."""
    if sort.key.figure and filters.statuses and JobStatus.succeeded not in filters.statuses:
        return []  # only a succeeded job has figures
    few = _narrowest(s, scope, filters)
    if few is not None:
        # The few jobs of one filter, read through its index (its condition, indexed),
        # then checked against every filter and sorted.
        q = _tagged(_checked(select(Job).where(*few), scope, filters, unindexed), filters.tags)
        key, ident = unindexed(sort.key.column), unindexed(Job.id)
    elif filters.tags and sort.key is SortKey.created:
        # Newest first with common tags: read from the first tag's own index, which holds
        # each job's creation time, so that the walk reads the tag's rows alone.
        first = aliased(JobTag)
        q = _checked(select(Job).join(first, first.job_id == Job.id), scope, filters)
        q = _tagged(q.where(first.tag == filters.tags[0]), filters.tags[1:])
        if not scope.everyone:
            q = q.where(first.owner == scope.owner)
        key, ident = first.created_at, first.job_id
    else:
        q = _tagged(_checked(select(Job), scope, filters), filters.tags)
        key, ident = sort.key.column, Job.id
    if sort.key.figure:
        q = q.where(key.is_not(None))
    if after is not None:
        mark, at = tuple_(key, ident), (_bound(after.value), after.job_id)
        q = q.where(mark < at if sort.descending else mark > at)
    order = (key.desc(), ident.desc()) if sort.descending else (key.asc(), ident.asc())
    return s.scalars(q.order_by(*order).limit(limit)).all()


def position_of(job: Job, sort: Sort) -> Position:
    return Position(getattr(job, sort.key.column.key), job.id)


Conditions = list[ColumnElement[bool]]


@dataclass(frozen=True)
class Narrowing:
    """A filter that may keep few jobs: what its index holds of them (counted), and its
    conditions on jobs, which that index reads."""

    kept: Select[Any]
    conditions: Conditions


def _narrowest(s: Session, scope: Scope, f: JobFilters) -> Conditions | None:
    """The conditions of the filter that keeps fewest jobs, if it keeps CANDIDATES_MAX at
    most (each counted on its own index, and no further than that); else None."""
    found: tuple[int, Conditions] | None = None
    for narrowing in _narrowing(scope, f):
        bounded = narrowing.kept.limit(CANDIDATES_MAX + 1).subquery()
        n = int(s.scalar(select(func.count()).select_from(bounded)) or 0)
        if n <= CANDIDATES_MAX and (found is None or n < found[0]):
            found = (n, narrowing.conditions)
    return found[1] if found else None


def _narrowing(scope: Scope, f: JobFilters) -> list[Narrowing]:
    """The filters that may keep few jobs (of the owner's)."""
    own: Conditions = [] if scope.everyone else [Job.owner == scope.owner]
    out = []
    for tag in f.tags:
        tagged = select(JobTag.job_id).where(JobTag.tag == tag)
        if not scope.everyone:
            tagged = tagged.where(JobTag.owner == scope.owner)
        out.append(Narrowing(tagged, [Job.id.in_(tagged)]))
    if f.name_prefix:
        out.append(_on_jobs([*own, *_name_range(f.name_prefix)]))
    if f.sweep_id is not None:
        # Its own index (sweep_id, trial_number): a sweep's trials are all its owner's, and
        # the owner is checked with every other filter.
        out.append(_on_jobs([Job.sweep_id == f.sweep_id]))
    if f.dataset is not None:
        out.append(_on_jobs([*own, Job.dataset == f.dataset]))
    if f.model is not None:
        out.append(_on_jobs([*own, Job.model == f.model]))
    if f.created_after is not None or f.created_before is not None:
        out.append(_on_jobs([*own, *_window(f, lambda c: c)]))
    return out


def _on_jobs(conditions: Conditions) -> Narrowing:
    return Narrowing(select(literal(1)).select_from(Job).where(*conditions), conditions)


def _checked(q: Select[Job], scope: Scope, f: JobFilters, col: Any = lambda c: c) -> Select[Job]:
    """Every filter but the tags, each on `col(column)`: the column itself, or `unindexed`
    where the page is read from a filter's ids and the rest are checks, not ways in."""
    if not scope.everyone:
        q = q.where(col(Job.owner) == scope.owner)
    if f.statuses:
        q = q.where(col(Job.status).in_(sorted(f.statuses)))
    if f.name_prefix:
        # Never a way in here: walking a common prefix's range and sorting it all costs
        # more than walking the order's index to the page's end.
        q = q.where(*_name_range(f.name_prefix, unindexed))
    if f.dataset is not None:
        q = q.where(col(Job.dataset) == f.dataset)
    if f.model is not None:
        q = q.where(col(Job.model) == f.model)
    if f.sweep_id is not None:
        q = q.where(col(Job.sweep_id) == f.sweep_id)
    if f.id_prefix is not None:
        q = q.where(col(Job.id).startswith(f.id_prefix, autoescape=True))
    return q.where(*_window(f, col))


def _tagged(q: Select[Job], tags: Sequence[str]) -> Select[Job]:
    """Jobs that have every one of `tags` (each checked on the job_tags key)."""
    for tag in tags:
        q = q.where(exists().where(JobTag.job_id == Job.id, JobTag.tag == tag))
    return q


def _name_range(prefix: str, col: Any = lambda c: c) -> list[ColumnElement[bool]]:
    low = name_key(prefix) or ""
    high = _past_prefix(low)
    key = col(Job.name_key)
    return [key >= low] if high is None else [key >= low, key < high]


def _window(f: JobFilters, col: Any) -> list[ColumnElement[bool]]:
    out = []
    if f.created_after is not None:
        out.append(col(Job.created_at) >= _bound(f.created_after))
    if f.created_before is not None:
        out.append(col(Job.created_at) < _bound(f.created_before))
    return out


def _bound(value: float | dt.datetime) -> float | dt.datetime:
    """A time as stored: UTC (SQLite keeps the digits, not the zone)."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return value


MAX_CHAR = 0x10FFFF
SURROGATES = range(0xD800, 0xE000)


def _past_prefix(prefix: str) -> str | None:
    """The first string after every string that starts with `prefix`, in code-point order
    (the order of name_key on both databases: SQLite's own, PostgreSQL's by its collation
    "C"); None where there is none (every character the last one)."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop()) + 1
        if last in SURROGATES:
            last = SURROGATES.stop
        if last <= MAX_CHAR:
            return "".join(chars) + chr(last)
    return None


class _Unindexed(FunctionElement[Any]):
    inherit_cache = True


def unindexed(column: Any) -> Any:
    """The column, as a value SQLite will not read through an index (SQLite's unary +): a
    page read from a filter's few ids is then read through them, not by walking an index
    of the order. PostgreSQL gets the column itself."""
    element = _Unindexed(column)
    element.type = column.type
    return element


@compiles(_Unindexed)
def _plain(element: _Unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(_Unindexed, "sqlite")
def _sqlite_unindexed(element: _Unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return f"+{compiler.process(element.clauses, **kw)}"

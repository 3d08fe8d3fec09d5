"""Per-owner quotas: the limits a key works within (Settings' defaults, overridden per owner
by a row in `quotas`), what it uses of them (training hours from `attempt_times`), and the
race-free checks that raise `QuotaExceeded`, each inside the transaction that then inserts
the rows, after `lock_owner`. See docs/quotas.md."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ColumnElement

from core.config import Settings
from core.db import (
    AttemptTime,
    Job,
    Quota,
    UserDataset,
    as_utc,
    db_ago,
    db_now,
    lock_name,
    utcnow,
)
from core.errors import QuotaExceeded
from core.spec import JobStatus

LIMIT_NAMES = ("max_queued", "max_running", "max_dataset_bytes", "max_train_hours_per_day")
DAY_S = 24 * 3600  # the window of max_train_hours_per_day
KEEP_ATTEMPT_TIMES_S = 2 * DAY_S  # an ended attempt's time, kept past its day for a margin
# Retry-After of a refusal at max_queued: with no finished job of the key's to judge by, and
# the most it says whatever the history.
QUEUE_WAIT_GUESS_S = 60
MAX_QUEUE_WAIT_S = 3600


class Limits(BaseModel):
    """One owner's limits, each None for no limit."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    # Strict: true is no count, and a limit past any real use (bounded to fit a BIGINT and
    # JSON's exact integers) is a typo, not a policy.
    max_queued: int | None = Field(None, ge=0, le=10**9, strict=True)
    max_running: int | None = Field(None, ge=1, le=10**6, strict=True)
    max_dataset_bytes: int | None = Field(None, ge=0, le=2**53, strict=True)
    max_train_hours_per_day: float | None = Field(None, gt=0, le=10**6)


UNLIMITED = Limits()


def default_limits(settings: Settings) -> Limits:
    return Limits(
        max_queued=settings.quota_max_queued,
        max_running=settings.quota_max_running,
        max_dataset_bytes=settings.quota_max_dataset_bytes,
        max_train_hours_per_day=settings.quota_max_train_hours_per_day,
    )


def limits_for(s: Session, settings: Settings, owner: str | None) -> Limits:
    """The owner's limits: its overrides over the defaults; none at all for admins."""
    return UNLIMITED if owner is None else in_force(settings, override_of(s, owner))


def override_of(s: Session, owner: str) -> Limits | None:
    """The limits an admin set for `owner` (only those fields set), if any."""
    row = s.get(Quota, owner)
    return None if row is None else _override(row)


def in_force(settings: Settings, override: Limits | None) -> Limits:
    """The defaults, with the fields set in `override` (an owner's, from `overrides`)."""
    base = default_limits(settings)
    if override is None:
        return base
    return base.model_copy(update=override.model_dump(exclude_unset=True))


def overrides(s: Session) -> dict[str, Limits]:
    """Every owner's overridden limits (only the fields set)."""
    return {row.owner: _override(row) for row in s.query(Quota)}


def _override(row: Quota) -> Limits:
    return Limits.model_validate(_known(row.limits))


def set_overrides(s: Session, owner: str, limits: Limits) -> None:
    """Replace `owner`'s overrides with the fields set in `limits` (None in one: no limit);
    the fields left out take the defaults again."""
    values = limits.model_dump(exclude_unset=True)
    if not values:  # nothing overridden: no row, as after clear_overrides
        clear_overrides(s, owner)
        return
    lock_owner(s, owner)  # two PUTs for a new owner at once: the second waits, then updates
    row = s.get(Quota, owner)
    if row is None:
        s.add(Quota(owner=owner, limits=values))
    else:
        row.limits = values
        row.updated_at = utcnow()
    s.flush()


def clear_overrides(s: Session, owner: str) -> None:
    """`owner` goes back to the defaults."""
    s.execute(delete(Quota).where(Quota.owner == owner))


def _known(raw: Any) -> dict[str, Any]:
    return {k: v for k, v in (raw or {}).items() if k in LIMIT_NAMES}


class Usage(BaseModel):
    """What one owner uses of its limits now."""

    queued: int = Field(0, description="Jobs queued.")
    running: int = Field(0, description="Jobs running.")
    dataset_bytes: int = Field(0, description="Bytes of the data sets it uploaded (as stored).")
    train_hours_24h: float = Field(
        0.0,
        description="Hours of training in the trailing 24 h: every attempt of its jobs, "
        "deleted ones too, running ones up to now.",
    )


@dataclass(frozen=True)
class Span:
    """One attempt, in seconds relative to now (the database's clock, which
    wrote the times): from `start` to `end` (<= 0; 0 while it runs)."""

    start: float
    end: float
    running: bool

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def trained_s(spans: Iterable[Span], day_ends_in_s: float = 0.0) -> float:
    """Seconds of training in the 24 hours that end `day_ends_in_s` from now, if the running
    spans stopped now."""
    day_start = day_ends_in_s - DAY_S
    return sum(max(0.0, sp.end - max(sp.start, day_start)) for sp in spans)


def usage(s: Session, owner: str) -> Usage:
    return _usages(s, [owner]).get(owner, Usage())


def every_usage(s: Session) -> dict[str | None, Usage]:
    """Every owner with jobs, data sets, overrides or training time in the trailing day
    (None: the jobs enqueued without one)."""
    found = _usages(s, None)
    for owner in [*s.scalars(select(Job.owner).distinct()), *s.scalars(select(Quota.owner))]:
        found.setdefault(owner, Usage())
    return found


def _usages(s: Session, owners: Sequence[str] | None) -> dict[str | None, Usage]:
    """The usage of `owners` (None: of every owner with something in use)."""
    figures: dict[str | None, dict[str, Any]] = {}
    active = select(Job.owner, Job.status, func.count()).where(
        Job.status.in_([JobStatus.queued, JobStatus.running])
    )
    if owners is not None:
        active = active.where(Job.owner.in_(owners))
    for owner, status, n in s.execute(active.group_by(Job.owner, Job.status)):
        figures.setdefault(owner, {})[str(status)] = n
    stored = select(UserDataset.owner, func.sum(UserDataset.size))
    if owners is not None:
        stored = stored.where(UserDataset.owner.in_(owners))
    for owner, size in s.execute(stored.group_by(UserDataset.owner)):
        figures.setdefault(owner, {})["dataset_bytes"] = int(size or 0)
    for owner, spans in spans_by_owner(s, owners).items():
        figures.setdefault(owner, {})["train_hours_24h"] = trained_s(spans) / 3600
    return {owner: Usage.model_validate(f) for owner, f in figures.items()}


def spans_by_owner(s: Session, owners: Sequence[str] | None) -> dict[str | None, list[Span]]:
    """The attempts of `owners`' jobs (None: everyone's) that ran within the trailing 24
    hours, their jobs deleted or not."""
    now = as_utc(s.scalar(select(db_now())))
    assert now is not None
    q = select(AttemptTime.owner, AttemptTime.started_at, AttemptTime.ended_at).where(
        or_(AttemptTime.ended_at.is_(None), AttemptTime.ended_at >= db_ago(DAY_S))
    )
    if owners is not None:
        q = q.where(AttemptTime.owner.in_(owners))
    found: dict[str | None, list[Span]] = {}
    for owner, started, ended in s.execute(q):
        running = ended is None
        end = 0.0 if ended is None else min(0.0, _since(ended, now))
        span = Span(start=min(end, _since(started, now)), end=end, running=running)
        found.setdefault(owner, []).append(span)
    return found


def orphaned_attempt_times() -> ColumnElement[bool]:
    """Attempts still open whose job no longer runs them. Every move off running ends its
    attempt in the same transaction, so only a worker of a trainq from before attempt_times
    leaves these (it ended the job, not the attempt); they would count up to now for good."""
    runs_it = select(Job.id).where(
        Job.id == AttemptTime.job_id,
        Job.attempt == AttemptTime.attempt,
        Job.status == JobStatus.running,
    )
    return AttemptTime.ended_at.is_(None) & ~runs_it.exists()


def spent_attempt_times() -> ColumnElement[bool]:
    """The attempts that ended before any trailing day: they count for nothing."""
    return AttemptTime.ended_at < db_ago(KEEP_ATTEMPT_TIMES_S)


def _since(t: dt.datetime | None, now: dt.datetime) -> float:
    stamp = as_utc(t)
    assert stamp is not None
    return (stamp - now).total_seconds()


def lock_owner(s: Session, owner: str) -> None:
    """Hold `owner`'s quota lock until this transaction ends, so that two API processes
    cannot both count the same usage and both pass (core.db.lock_name)."""
    lock_name(s, f"trainq-quota:{owner}")


@dataclass
class _Account:
    limits: Limits
    queued: int
    spans: list[Span] | None = None  # read when a check needs them


class JobQuotas:
    """The quota checks of one transaction that inserts jobs (api.services.submitter): each owner is
    locked first (all in one order, so that two batches never wait on each other in a
    cycle), its limits and usage are read once, and every job planned since counts as
    queued: a batch passes a limit no more than separate submissions would."""

    def __init__(self, s: Session, settings: Settings, owners: Iterable[str]) -> None:
        self._s = s
        self._settings = settings
        self._accounts: dict[str, _Account] = {}
        for owner in sorted(set(owners)):
            lock_owner(s, owner)

    def take(self, owner: str) -> None:
        """Count one more queued job of `owner`, or raise QuotaExceeded (queued jobs, or
        training hours of the trailing day: a job is admitted while they are under the
        limit, and may take them past it as it runs)."""
        account = self._account(owner)
        limits = account.limits
        if limits.max_queued is not None and account.queued >= limits.max_queued:
            raise self._too_many_queued(owner, account, limits.max_queued)
        if limits.max_train_hours_per_day is not None:
            limit_s = limits.max_train_hours_per_day * 3600
            used_s = trained_s(self._spans(owner, account))
            if used_s >= limit_s:
                raise _too_many_hours(owner, self._spans(owner, account), limit_s, used_s)
        account.queued += 1

    def _account(self, owner: str) -> _Account:
        if owner not in self._accounts:
            queued = self._s.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.owner == owner, Job.status == JobStatus.queued)
            )
            limits = limits_for(self._s, self._settings, owner)
            self._accounts[owner] = _Account(limits=limits, queued=int(queued or 0))
        return self._accounts[owner]

    def _spans(self, owner: str, account: _Account) -> list[Span]:
        if account.spans is None:
            account.spans = spans_by_owner(self._s, [owner]).get(owner, [])
        return account.spans

    def _too_many_queued(self, owner: str, account: _Account, limit: int) -> QuotaExceeded:
        if limit == 0:
            message = f"key {owner} may not queue jobs (max_queued is 0): ask an admin"
            wait = None
        else:
            wait = queue_wait_s(self._spans(owner, account))
            message = (
                f"key {owner} has {account.queued} jobs queued, its limit (max_queued): "
                f"retry when one has started (about {wait} s), or cancel one"
            )
        return QuotaExceeded(
            message,
            limit="max_queued",
            value=limit,
            usage=account.queued,
            owner=owner,
            retry_after_s=wait,
        )


def queue_wait_s(spans: Sequence[Span]) -> int:
    """About when one of the key's queued jobs will have started: with n of its jobs running,
    one ends about every (their mean run) / n, judged by its attempts that ended within
    the trailing day; QUEUE_WAIT_GUESS_S where there is nothing to judge by."""
    ended = [sp.seconds for sp in spans if not sp.running]
    running = sum(sp.running for sp in spans)
    if not ended or not running:
        return QUEUE_WAIT_GUESS_S
    return min(MAX_QUEUE_WAIT_S, max(1, math.ceil(sum(ended) / len(ended) / running)))


def hours_wait_s(spans: Sequence[Span], limit_s: float) -> int:
    """Seconds until the trailing day holds less than `limit_s` of training, if the running
    spans stopped now (a bisection to the second: what the day holds only shrinks)."""
    lo, hi = 0.0, float(DAY_S)
    while hi - lo > 1:
        mid = (lo + hi) / 2
        if trained_s(spans, mid) < limit_s:
            hi = mid
        else:
            lo = mid
    return math.ceil(hi)


def _too_many_hours(owner: str, spans: list[Span], limit_s: float, used_s: float) -> QuotaExceeded:
    wait = hours_wait_s(spans, limit_s)
    limit_h, used_h = limit_s / 3600, used_s / 3600
    return QuotaExceeded(
        f"key {owner} trained {used_h:.3f} h in the last 24 h, its limit "
        f"(max_train_hours_per_day {limit_h:g}): retry in {wait} s, when enough of that "
        "time has aged out (later, if its running jobs go on)",
        limit="max_train_hours_per_day",
        value=limit_h,
        usage=round(used_h, 6),
        owner=owner,
        retry_after_s=wait,
    )


def check_dataset_room(s: Session, settings: Settings, owner: str, adding: int) -> None:
    """Raise QuotaExceeded if `adding` more bytes of data sets would take `owner` past its
    max_dataset_bytes. Race-free only after lock_owner, in the transaction that inserts."""
    limit = limits_for(s, settings, owner).max_dataset_bytes
    if limit is None:
        return
    stored = select(func.sum(UserDataset.size)).where(UserDataset.owner == owner)
    used = int(s.scalar(stored) or 0)
    if used + adding <= limit:
        return
    raise QuotaExceeded(
        f"key {owner} holds {used} bytes of data sets; {adding} more would pass its limit "
        f"(max_dataset_bytes {limit}): delete a data set, or ask an admin for more",
        limit="max_dataset_bytes",
        value=limit,
        usage=used,
        owner=owner,
        retry_after_s=None,
    )

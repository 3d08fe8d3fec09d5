"""The delivery rows' life: claimed by a dispatcher under a lease (a guarded UPDATE, after a
SELECT that skips rows other dispatchers hold on PostgreSQL), fairly across endpoints and at
most a few under way to any one, oldest first; then delivered, or failed and due again after
an exponential back-off with jitter. A day after its first attempt (or at a 410 Gone) the
endpoint is marked failing, and its deliveries are held, never dropped, until it is enabled
again; delivery paused holds them all. Attempts are counted by outcome; ended deliveries
leave the log. Every time is the database's clock (core.db.clock).
See docs/api.md ("Webhooks")."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, exists, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.db import (
    WebhookAttemptCount,
    WebhookDelivery,
    WebhookDeliveryState,
    WebhookEndpoint,
    WebhookEvent,
    as_utc,
    db_ago,
    db_now,
)
from core.webhooks.sender import AttemptOutcome, Outcome

D, E = WebhookDelivery, WebhookEndpoint
# A delivery is pending until an attempt delivers it. (Revision 0017 also gave one up as
# "failed"; 0018 made those of endpoints still failing pending again, held.)
PENDING, DELIVERED = "pending", "delivered"
RETRY_FACTOR = 3.0
RETRY_MAX_S = 3 * 3600.0
GONE = 410  # the receiver says it wants no more: the endpoint is marked failing at once


@dataclass(frozen=True)
class Claimed:
    """A delivery a dispatcher holds until `claim` is replaced (its lease ended)."""

    id: int
    claim: str
    attempts: int  # this attempt's number
    endpoint_id: str
    url: str
    secret: str
    event_id: str
    body: str


@dataclass(frozen=True)
class Retries:
    """How failed deliveries are retried (core.webhooks.dispatcher.Pace)."""

    base_s: float
    for_s: float

    def delay(self, attempts: int, rng: random.Random) -> float:
        """The wait after failed attempt number `attempts`: base, then three times longer
        each time, three hours at most, with jitter (half to all of it) so that the
        deliveries a receiver's outage failed together do not come back together."""
        full = min(self.base_s * RETRY_FACTOR ** (attempts - 1), RETRY_MAX_S)
        return full * rng.uniform(0.5, 1.0)


@dataclass(frozen=True)
class Recorded:
    """What storing an attempt's outcome came to."""

    kept: bool  # False: the lease had ended, and the delivery is another attempt's now
    again_in_s: float | None = None  # a failure: due again this long after (held if failing)
    failing: str | None = None  # why this outcome marked the endpoint failing; None: it did not


def delivery_paused() -> Any:
    """Whether an operator paused delivery (core.webhooks.delivery_state): a condition inside
    the claim's own statements, so that no claim made after the pause committed sends."""
    State = WebhookDeliveryState
    return exists(select(State.id).where(State.paused_at.is_not(None)))


def _deliverable() -> Any:
    return (
        (D.status == PENDING) & E.enabled.is_(True) & E.failing_since.is_(None) & ~delivery_paused()
    )


def any_due(s: Session) -> bool:
    """Whether a claim would find something: a read, cheap enough to poll (no write lock)."""
    due = select(D.id).join(E, E.id == D.endpoint_id)
    return bool(s.scalar(select(exists(due.where(_deliverable(), D.next_attempt_at <= db_now())))))


def claim_due(
    s: Session, *, lease_s: float, limit: int, per_endpoint: int, per_owner: int
) -> list[Claimed]:
    """Up to `limit` due deliveries, each held for `lease_s`: its next attempt is moved past
    the lease under a new claim token, so a dispatcher killed mid-attempt leaves it due
    again then, and any other dispatcher's claim of it now changes no row. Fair: each
    endpoint's oldest first, round by round across endpoints, and none past `per_endpoint`
    under way to one endpoint, nor past `per_owner` to one key's endpoints (whichever
    dispatcher holds them), so that a receiver that hangs, or a key's many, hold back their
    own deliveries and no one else's."""
    ids = _fair_pick(s, limit=limit, per_endpoint=per_endpoint, per_owner=per_owner)
    if not ids:
        return []
    ids = s.scalars(
        select(D.id).where(D.id.in_(ids)).with_for_update(skip_locked=True)
    ).all()  # PostgreSQL: rows another dispatcher holds are skipped; SQLite's writer holds all
    token = str(uuid.uuid4())
    s.execute(
        update(D)
        .where(D.id.in_(ids), D.status == PENDING, D.next_attempt_at <= db_now())
        .where(~delivery_paused())
        .values(
            claim=token,
            attempts=D.attempts + 1,
            next_attempt_at=db_ago(-lease_s),
            last_attempt_at=db_now(),
            trying_since=func.coalesce(D.trying_since, db_now()),
        )
    )
    rows = s.execute(
        select(D.id, D.attempts, D.endpoint_id, E.url, E.secret, D.event_id, WebhookEvent.body)
        .join(E, E.id == D.endpoint_id)
        .join(WebhookEvent, WebhookEvent.id == D.event_id)
        .where(D.claim == token)
        .order_by(D.id)
    )
    return [
        Claimed(r.id, token, r.attempts, r.endpoint_id, r.url, r.secret, r.event_id, r.body)
        for r in rows
    ]


def _fair_pick(s: Session, *, limit: int, per_endpoint: int, per_owner: int) -> Sequence[int]:
    """The due deliveries to claim: each endpoint's numbered oldest first, as many as its
    free slots (`per_endpoint` less those under a lease now) and its key's (`per_owner` less
    the key's under a lease), taken by that number across endpoints: every endpoint's
    first, then every endpoint's second."""
    leased = (D.status == PENDING, D.claim.is_not(None), D.next_attempt_at > db_now())
    on_endpoint = (
        select(D.endpoint_id, func.count().label("n"))
        .where(*leased)
        .group_by(D.endpoint_id)
        .subquery()
    )
    of_owner = (
        select(E.owner, func.count().label("n"))
        .join(D, D.endpoint_id == E.id)
        .where(*leased)
        .group_by(E.owner)
        .subquery()
    )
    place = func.row_number().over(partition_by=D.endpoint_id, order_by=D.id)
    due = (
        select(D.id, D.endpoint_id, E.owner, place.label("place"))
        .join(E, E.id == D.endpoint_id)
        .where(_deliverable(), D.next_attempt_at <= db_now())
        .subquery()
    )
    free = (
        select(due)
        .outerjoin(on_endpoint, on_endpoint.c.endpoint_id == due.c.endpoint_id)
        .where(due.c.place + func.coalesce(on_endpoint.c.n, 0) <= per_endpoint)
        .subquery()
    )
    owner_place = func.row_number().over(
        partition_by=free.c.owner, order_by=(free.c.place, free.c.id)
    )
    ranked = select(free, owner_place.label("owner_place")).subquery()
    return s.scalars(
        select(ranked.c.id)
        .outerjoin(of_owner, of_owner.c.owner == ranked.c.owner)
        .where(ranked.c.owner_place + func.coalesce(of_owner.c.n, 0) <= per_owner)
        .order_by(ranked.c.place, ranked.c.id)
        .limit(limit)
    ).all()


def record_outcome(
    s: Session, claimed: Claimed, outcome: Outcome, retries: Retries, rng: random.Random
) -> Recorded:
    """Store an attempt's outcome, and count it, if the claim still holds (not kept: its
    lease ended and the delivery is another attempt's now). A failure is due again after
    `retries.delay`; past `retries.for_s` since the delivery's first attempt (or at a 410
    Gone) its endpoint is marked failing too, and the delivery stays pending, held with
    every later one until the endpoint is enabled again."""
    mine = (D.id == claimed.id) & (D.claim == claimed.claim)
    seen = {
        "last_status_code": outcome.status_code,
        "latency_ms": outcome.latency_ms,
        "last_error": outcome.error,
        "claim": None,
    }
    if outcome.delivered:
        done = (
            update(WebhookDelivery)
            .where(mine)
            .values(status=DELIVERED, delivered_at=db_now(), **seen)
        )
        if not _changed(s, done):
            return Recorded(kept=False)
        count_attempt(s, outcome.kind)
        return Recorded(kept=True)
    wait = retries.delay(claimed.attempts, rng)
    # Whether the next attempt would come past the delivery's day (its `trying_since`).
    late = bool(s.scalar(select(D.trying_since < db_ago(retries.for_s - wait)).where(mine)))
    if not _changed(s, update(D).where(mine).values(next_attempt_at=db_ago(-wait), **seen)):
        return Recorded(kept=False)
    count_attempt(s, outcome.kind)
    why = None
    if outcome.status_code == GONE:
        why = "it answered 410 Gone"
    elif late:
        why = f"no delivery succeeded for {retries.for_s:g} s (last: {outcome.error})"
    marked = why is not None and mark_failing(s, endpoint_id=claimed.endpoint_id, why=why)
    return Recorded(kept=True, again_in_s=wait, failing=why if marked else None)


def mark_failing(s: Session, *, endpoint_id: str, why: str) -> bool:
    """No more deliveries to the endpoint until its key enables it again; its events are
    held meanwhile. False if it was marked already."""
    return _changed(
        s,
        update(E)
        .where(E.id == endpoint_id, E.failing_since.is_(None))
        .values(failing_since=db_now(), failing_reason=why[:1000]),
    )


def restart_retries(s: Session, *, endpoint_id: str | None = None) -> None:
    """The pending deliveries (of one endpoint, or all) deliverable again, as an endpoint
    enabled or delivery resumed makes them: due now, oldest first, and their day of retries
    counted anew from their next attempt. One under way (its lease) is left to its outcome."""
    waiting = (D.status == PENDING) & or_(D.claim.is_(None), D.next_attempt_at <= db_now())
    if endpoint_id is not None:
        waiting = waiting & (D.endpoint_id == endpoint_id)
    s.execute(update(D).where(waiting).values(next_attempt_at=db_now(), trying_since=None))


def count_attempt(s: Session, outcome: AttemptOutcome) -> None:
    """One more attempt of this outcome (trainq_webhook_attempts_total), in the transaction
    that stores it: counted once, whichever dispatcher made it."""
    dialect = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
    insert = dialect.insert(WebhookAttemptCount).values(outcome=outcome.value, attempts=1)
    s.execute(
        insert.on_conflict_do_update(
            index_elements=[WebhookAttemptCount.outcome],
            set_={"attempts": WebhookAttemptCount.attempts + 1},
        )
    )


@dataclass(frozen=True)
class Backlog:
    """What /metrics shows of delivery (api.observability)."""

    pending: int  # not yet delivered, held ones among them
    held: int  # pending to an endpoint failing or disabled, or every one while paused
    oldest_pending_s: float  # the oldest pending delivery's age; 0 with none
    endpoints_failing: int
    paused: bool  # an operator paused delivery
    attempts: dict[AttemptOutcome, int]  # since the database began counting


def waiting(s: Session, *, endpoint_id: str, event_type: str) -> int:
    """The endpoint's events of `event_type` not yet delivered."""
    return (
        s.scalar(
            select(func.count())
            .select_from(D)
            .join(WebhookEvent, WebhookEvent.id == D.event_id)
            .where(
                D.endpoint_id == endpoint_id, D.status == PENDING, WebhookEvent.type == event_type
            )
        )
        or 0
    )


def backlog(s: Session) -> Backlog:
    pending, oldest, now = s.execute(
        select(func.count(), func.min(D.created_at), db_now()).where(D.status == PENDING)
    ).one()
    stopped = ~(E.enabled.is_(True) & E.failing_since.is_(None))
    held = s.scalar(
        select(func.count())
        .select_from(D)
        .join(E, E.id == D.endpoint_id)
        .where(D.status == PENDING, stopped | delivery_paused())
    )
    failing = s.scalar(select(func.count()).where(E.failing_since.is_not(None)))
    paused = bool(s.scalar(select(delivery_paused())))
    counts = select(WebhookAttemptCount.outcome, WebhookAttemptCount.attempts)
    counted = {outcome: n for outcome, n in s.execute(counts)}
    return Backlog(
        pending=int(pending),
        held=int(held or 0),
        oldest_pending_s=age_s(oldest, now) or 0.0,
        endpoints_failing=int(failing or 0),
        paused=paused,
        attempts={kind: int(counted.get(kind.value, 0)) for kind in AttemptOutcome},
    )


def age_s(then: dt.datetime | None, now: dt.datetime | None) -> float | None:
    """Seconds from `then` to `now`, two times the database gave (SQLite's naive), or None."""
    if then is None or now is None:
        return None
    return max((as_utc(now) - as_utc(then)).total_seconds(), 0.0)  # type: ignore[operator]


def _changed(s: Session, statement: Any) -> bool:
    return bool(s.execute(statement).rowcount)  # type: ignore[attr-defined]


def delivery_log(s: Session, *, endpoint_id: str, before: int | None, limit: int) -> Sequence[Any]:
    """An endpoint's deliveries, newest first, with their events' ids and types; `before`,
    the id of the previous page's last."""
    q = (
        select(D, WebhookEvent.type)
        .join(WebhookEvent, WebhookEvent.id == D.event_id)
        .where(D.endpoint_id == endpoint_id)
    )
    if before is not None:
        q = q.where(D.id < before)
    return s.execute(q.order_by(D.id.desc()).limit(limit)).all()


def purge_log(s: Session, *, older_than_s: float, batch: int = 1000) -> int:
    """Ended deliveries older than `older_than_s`, and the events left with none; how many
    deliveries went."""
    old = s.scalars(
        select(D.id).where(D.status != PENDING, D.created_at < db_ago(older_than_s)).limit(batch)
    ).all()
    if not old:
        return 0
    s.execute(delete(D).where(D.id.in_(old)))
    orphan = ~exists(select(D.id).where(D.event_id == WebhookEvent.id))
    s.execute(delete(WebhookEvent).where(orphan, WebhookEvent.created_at < db_ago(older_than_s)))
    return len(old)

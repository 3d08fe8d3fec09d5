"""The delivery rows' life: claimed by a dispatcher under a lease (a guarded UPDATE, after a
SELECT that skips rows other dispatchers hold on PostgreSQL), then delivered, or failed and
due again after an exponential back-off with jitter, until a day has passed (the endpoint is
then marked failing), and their log. Every time is the database's clock (core.db.clock).
See docs/api.md ("Webhooks")."""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, exists, select, update
from sqlalchemy.orm import Session

from core.db import WebhookDelivery, WebhookEndpoint, WebhookEvent, db_ago, db_now
from core.webhooks.sender import Outcome

D, E = WebhookDelivery, WebhookEndpoint
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
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
    """How failed deliveries are retried (Settings.webhook_retry_*)."""

    base_s: float
    for_s: float

    def delay(self, attempts: int, rng: random.Random) -> float:
        """The wait after failed attempt number `attempts`: base, then three times longer
        each time, three hours at most, with jitter (half to all of it) so that the
        deliveries a receiver's outage failed together do not come back together."""
        full = min(self.base_s * RETRY_FACTOR ** (attempts - 1), RETRY_MAX_S)
        return full * rng.uniform(0.5, 1.0)


def _deliverable() -> Any:
    return (D.status == PENDING) & E.enabled.is_(True) & E.failing_since.is_(None)


def any_due(s: Session) -> bool:
    """Whether a claim would find something: a read, cheap enough to poll (no write lock)."""
    due = select(D.id).join(E, E.id == D.endpoint_id)
    return bool(s.scalar(select(exists(due.where(_deliverable(), D.next_attempt_at <= db_now())))))


def claim_due(s: Session, *, lease_s: float, limit: int) -> list[Claimed]:
    """Up to `limit` due deliveries, each held for `lease_s`: its next attempt is moved past
    the lease under a new claim token, so a dispatcher killed mid-attempt leaves it due
    again then, and any other dispatcher's claim of it now changes no row."""
    ids = s.scalars(
        select(D.id)
        .join(E, E.id == D.endpoint_id)
        .where(_deliverable(), D.next_attempt_at <= db_now())
        .order_by(D.next_attempt_at)
        .limit(limit)
        .with_for_update(of=D, skip_locked=True)  # PostgreSQL; SQLite's writer holds the lock
    ).all()
    if not ids:
        return []
    token = str(uuid.uuid4())
    s.execute(
        update(D)
        .where(D.id.in_(ids), D.status == PENDING, D.next_attempt_at <= db_now())
        .values(
            claim=token,
            attempts=D.attempts + 1,
            next_attempt_at=db_ago(-lease_s),
            last_attempt_at=db_now(),
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


def record_outcome(
    s: Session, claimed: Claimed, outcome: Outcome, retries: Retries, rng: random.Random
) -> bool:
    """Store an attempt's outcome, if the claim still holds (False: its lease ended and the
    delivery is another attempt's now). A failure is due again after `retries.delay`, or,
    past `retries.for_s` since the event (or at a 410 Gone), failed for good, and its
    endpoint is marked failing."""
    mine = (D.id == claimed.id) & (D.claim == claimed.claim)
    seen = {
        "last_status_code": outcome.status_code,
        "latency_ms": outcome.latency_ms,
        "last_error": outcome.error,
        "claim": None,
    }
    if outcome.delivered:
        now = {"delivered_at": db_now(), **seen}
        return _changed(s, update(WebhookDelivery).where(mine).values(status=DELIVERED, **now))
    wait = retries.delay(claimed.attempts, rng)
    late = D.created_at < db_ago(retries.for_s - wait)
    if outcome.status_code != GONE:
        again = update(D).where(mine, ~late).values(next_attempt_at=db_ago(-wait), **seen)
        if _changed(s, again):
            return True
    if not _changed(s, update(WebhookDelivery).where(mine).values(status=FAILED, **seen)):
        return False
    why = (
        "it answered 410 Gone"
        if outcome.status_code == GONE
        else f"no delivery succeeded for {retries.for_s:g} s (last: {outcome.error})"
    )
    mark_failing(s, endpoint_id=claimed.endpoint_id, why=why)
    return True


def mark_failing(s: Session, *, endpoint_id: str, why: str) -> None:
    """No more deliveries to the endpoint until its key enables it again."""
    s.execute(
        update(E)
        .where(E.id == endpoint_id, E.failing_since.is_(None))
        .values(failing_since=db_now(), failing_reason=why[:1000])
    )


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

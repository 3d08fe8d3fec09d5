"""Delivery as a whole: paused by an operator (every event held, none lost, until it is
resumed: a restored copy of the database starts so) and alive (when a dispatcher last
finished a pass). One row, webhook_delivery_state; a database without it delivers, unpaused.
Keyword-only functions over a Session, not committed here, as core.store's are.
See docs/operations.md ("Webhooks")."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from core.db import WebhookDeliveryState, as_utc, db_now
from core.webhooks.deliveries import age_s, restart_retries

State = WebhookDeliveryState
ROW = 1
# A dispatcher writes that it is alive at most this often (a write: not at every poll) ...
BEAT_EVERY_S = 5.0
# ... and delivery counts as dead or stuck when none has for this long.
STALE_AFTER_S = 30.0


class DeliveryStatus(StrEnum):
    ok = "ok"
    paused = "paused"  # an operator paused it: every event is held
    degraded = "degraded"  # no dispatcher finished a pass within STALE_AFTER_S: dead or stuck


@dataclass(frozen=True)
class DeliveryState:
    paused_at: dt.datetime | None
    paused_by: str | None
    reason: str | None
    since_dispatch_s: float | None  # since a dispatcher last finished a pass; None: never
    status: DeliveryStatus

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


def pause_delivery(s: Session, *, by: str, reason: str | None = None) -> bool:
    """Hold every webhook event, losing none, until resume_delivery: no dispatcher claims a
    delivery once this commits (attempts under way end as they will), and events go on being
    written to the outbox. `by`: who paused it (an admin's owner id, a command's name).
    False if it was paused already (then unchanged)."""
    _ensure_row(s)
    values = {"paused_at": db_now(), "paused_by": by[:64], "paused_reason": reason}
    changed = s.execute(
        update(State).where(State.id == ROW, State.paused_at.is_(None)).values(values)
    )
    return bool(changed.rowcount)  # type: ignore[attr-defined]


def resume_delivery(s: Session) -> bool:
    """Deliver again what was held, oldest first; the day of retries of each delivery counts
    anew from its next attempt (the pause's time is not held against it). False if delivery
    was not paused."""
    cleared = {"paused_at": None, "paused_by": None, "paused_reason": None}
    changed = s.execute(
        update(State).where(State.id == ROW, State.paused_at.is_not(None)).values(cleared)
    )
    if not changed.rowcount:  # type: ignore[attr-defined]
        return False
    restart_retries(s)
    return True


def record_pass(s: Session) -> None:
    """A dispatcher finished a pass now (the database's clock)."""
    _ensure_row(s)
    s.execute(update(State).where(State.id == ROW).values(dispatched_at=db_now()))


def delivery_state(s: Session, *, stale_after_s: float = STALE_AFTER_S) -> DeliveryState:
    row = s.execute(
        select(State.paused_at, State.paused_by, State.paused_reason, State.dispatched_at)
        .where(State.id == ROW)
    ).one_or_none()  # fmt: skip
    paused_at, by, reason, dispatched = row if row is not None else (None, None, None, None)
    since = age_s(dispatched, s.scalar(select(db_now())))
    if since is None or since > stale_after_s:  # paused or not: the more urgent news
        status = DeliveryStatus.degraded
    elif paused_at is not None:
        status = DeliveryStatus.paused
    else:
        status = DeliveryStatus.ok
    return DeliveryState(as_utc(paused_at), by, reason, since, status)


def _ensure_row(s: Session) -> None:
    """The row migration 0018 wrote, written again if someone deleted it."""
    if s.get(State, ROW) is None:
        s.add(State(id=ROW))
        s.flush()

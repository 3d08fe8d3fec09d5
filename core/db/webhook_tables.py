"""The tables of signed webhooks (core.webhooks): the endpoints keys registered, the outbox of
events written in the transaction of each change they tell of, one delivery row per event
and endpoint, the one row of delivery's own state (paused, the dispatchers' last pass) and the
attempts counted by outcome. See docs/api.md ("Webhooks")."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from core.db.clock import db_now, utcnow
from core.db.tables import Base


class WebhookEndpoint(Base):
    """A URL a key registered for some event types (core.webhooks). `secret` signs every
    delivery (Standard Webhooks, `whsec_<base64>`); the API shows it once, at creation.
    Deliveries stop while `enabled` is false (the key's choice: no event is kept for it
    meanwhile) or `failing_since` is set (retried for a day without success, or answered 410
    Gone: its events are kept, held, and go in order once it is enabled again)."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_owner_created", "owner", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON)
    description: Mapped[str | None] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(120))
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    failing_since: Mapped[dt.datetime | None]
    failing_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class WebhookEvent(Base):
    """An event in the outbox (core.webhooks.outbox), written in the transaction of the change
    it tells of: its `body` is the JSON sent, byte for byte, at every attempt to every
    endpoint; its id is the `webhook-id` they all carry."""

    __tablename__ = "webhook_events"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    type: Mapped[str] = mapped_column(String(40))
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=db_now())


class WebhookDelivery(Base):
    """One event to one endpoint: pending until an attempt gets a 2xx (delivered), held
    meanwhile while its endpoint is failing or disabled or delivery is paused. A dispatcher
    claims a due one by moving `next_attempt_at` a lease ahead under its own `claim` token:
    should it die mid-attempt, the row is due again when the lease ends
    (core.webhooks.deliveries). `trying_since` is its first attempt since it last became
    deliverable (its endpoint enabled, delivery resumed): the day of retries counts from
    there, not from the event."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_endpoint", "endpoint_id", "id"),
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            sqlite_where=text("status = 'pending'"),
            postgresql_where=text("status = 'pending'"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_events.id", ondelete="CASCADE"), index=True
    )
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(default=db_now())
    claim: Mapped[str | None] = mapped_column(String(36))
    last_attempt_at: Mapped[dt.datetime | None]
    last_status_code: Mapped[int | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    delivered_at: Mapped[dt.datetime | None]
    created_at: Mapped[dt.datetime] = mapped_column(default=db_now())
    trying_since: Mapped[dt.datetime | None]


class WebhookDeliveryState(Base):
    """Delivery's one row (id 1; a database without it delivers, unpaused): `paused_at` set
    while an operator has paused every delivery (core.webhooks.delivery_state; a restored
    copy starts so), and `dispatched_at`, when a dispatcher last finished a pass, on the
    database's clock: /health's sign that delivery is alive."""

    __tablename__ = "webhook_delivery_state"
    __table_args__ = (CheckConstraint("id = 1", name="ck_webhook_delivery_state_one_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    paused_at: Mapped[dt.datetime | None]
    paused_by: Mapped[str | None] = mapped_column(String(64))
    paused_reason: Mapped[str | None] = mapped_column(Text)
    dispatched_at: Mapped[dt.datetime | None]


class WebhookAttemptCount(Base):
    """Delivery attempts made, by outcome (core.webhooks.sender.AttemptOutcome), counted in
    the transaction that stores each: /metrics' trainq_webhook_attempts_total, the same from
    every API process."""

    __tablename__ = "webhook_attempt_counts"

    outcome: Mapped[str] = mapped_column(String(16), primary_key=True)
    attempts: Mapped[int] = mapped_column(BigInteger)

"""The tables of signed webhooks (core.webhooks): the endpoints keys registered, the outbox of
events written in the transaction of each change they tell of, and one delivery row per
event and endpoint. See docs/api.md ("Webhooks")."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from core.db.clock import db_now, utcnow
from core.db.tables import Base


class WebhookEndpoint(Base):
    """A URL a key registered for some event types (core.webhooks). `secret` signs every
    delivery (Standard Webhooks, `whsec_<base64>`); the API shows it once, at creation.
    Deliveries stop while `enabled` is false (the key's choice) or `failing_since` is set
    (retried for a day without success, or answered 410 Gone) until it is enabled again."""

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
    """One event to one endpoint: pending until an attempt gets a 2xx (delivered) or the
    retries end (failed). A dispatcher claims a due one by moving `next_attempt_at` a lease
    ahead under its own `claim` token: should it die mid-attempt, the row is due again when
    the lease ends (core.webhooks.deliveries)."""

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

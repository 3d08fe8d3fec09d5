"""The /webhooks routes' bodies and answers (documented in OpenAPI at /docs). See docs/api.md
("Webhooks")."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.text import PLAIN_PATTERN
from core.webhooks.addresses import MAX_URL_LENGTH
from core.webhooks.outbox import EventType

MAX_DESCRIPTION = 500
URL_HELP = (
    "Where the events are POSTed: https:// (or http://) and a public address; the API "
    "resolves its host and refuses internal addresses (422)."
)
EVENTS_HELP = "The event types this endpoint hears (each once)."


def _once(events: list[EventType] | None) -> list[EventType] | None:
    return None if events is None else list(dict.fromkeys(events))


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=MAX_URL_LENGTH, description=URL_HELP)
    events: list[EventType] = Field(
        min_length=1, max_length=len(EventType), description=EVENTS_HELP
    )
    description: str | None = Field(None, max_length=MAX_DESCRIPTION, pattern=PLAIN_PATTERN)

    _events_once = field_validator("events")(_once)


class WebhookPatch(BaseModel):
    """Only the fields sent change; `enabled: true` also clears a failing mark."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(None, max_length=MAX_URL_LENGTH, description=URL_HELP)
    events: list[EventType] | None = Field(
        None, min_length=1, max_length=len(EventType), description=EVENTS_HELP
    )
    description: str | None = Field(None, max_length=MAX_DESCRIPTION, pattern=PLAIN_PATTERN)
    enabled: bool | None = None

    _events_once = field_validator("events")(_once)

    @model_validator(mode="after")
    def _no_null_but_description(self) -> WebhookPatch:
        nulls = [n for n in ("url", "events", "enabled") if n in self.model_fields_set]
        if any(getattr(self, n) is None for n in nulls):
            raise ValueError("url, events and enabled cannot be null: leave them out instead")
        return self


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[str]
    description: str | None
    enabled: bool = Field(description="False: disabled by its key (PATCH enabled).")
    failing_since: dt.datetime | None = Field(
        description="Set when deliveries stopped by themselves (a day of failures, or a 410 "
        "Gone): none go until PATCH enabled=true."
    )
    failing_reason: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    links: dict[str, str]


class WebhookCreated(WebhookOut):
    secret: str = Field(
        description="`whsec_<base64>`: verifies the `webhook-signature` of every delivery "
        "(Standard Webhooks). Shown this once: keep it."
    )


class DeliveryStateOut(BaseModel):
    """Webhook delivery as a whole (core.webhooks.delivery_state)."""

    status: str = Field(
        description="ok; paused (an admin paused delivery: every event is held, none lost); "
        "degraded (no dispatcher finished a pass in the last 30 s: dead or stuck)."
    )
    paused: bool
    paused_at: dt.datetime | None
    paused_by: str | None = Field(None, description="With an admin key only: who paused it.")
    reason: str | None = Field(None, description="With an admin key only: why, as they said.")
    since_dispatch_s: float | None = Field(
        description="Seconds since a dispatcher (any API process's) last finished a pass; "
        "null: none ever did."
    )


class PauseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(None, max_length=MAX_DESCRIPTION, pattern=PLAIN_PATTERN)


class WebhookList(BaseModel):
    items: list[WebhookOut]
    delivery: DeliveryStateOut = Field(
        description="Delivery as a whole: paused, or alive, whoever's endpoints these are."
    )


class DeliveryOut(BaseModel):
    id: int
    event_id: str = Field(description="The `webhook-id` every attempt of it carried.")
    type: str
    status: str = Field(
        description="pending (due again at next_attempt_at; held while its endpoint is "
        "failing or disabled, or delivery is paused), delivered; failed only for deliveries "
        "that gave up before revision 0018."
    )
    status_code: int | None = Field(description="The last attempt's answer (null: none).")
    latency_ms: float | None = Field(description="The last attempt's time.")
    attempts: int
    next_attempt_at: dt.datetime | None
    last_error: str | None
    created_at: dt.datetime
    last_attempt_at: dt.datetime | None
    delivered_at: dt.datetime | None


class DeliveryPage(BaseModel):
    items: list[DeliveryOut]
    next: str | None = Field(description="Cursor for the next page, or null at the end.")


class TestEventSent(BaseModel):
    event_id: str
    links: dict[str, Any]

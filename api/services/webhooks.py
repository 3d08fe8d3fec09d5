"""What the /webhooks routes do: an endpoint registered within its key's bound after its URL's
addresses are checked (core.webhooks.addresses), looked up as its key may see it, changed,
removed, sent a test event through the outbox, and its delivery log read.
See docs/api.md ("Webhooks")."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from api.auth import Caller
from api.webhook_schemas import DeliveryOut, DeliveryPage, WebhookIn, WebhookOut, WebhookPatch
from core.config import Settings
from core.db import WebhookEndpoint, as_utc
from core.errors import EndpointDisabled, InvalidRequest, NotFound, QuotaExceeded
from core.quotas import lock_owner
from core.webhooks.addresses import AddressPolicy, UnsafeUrl, checked_target
from core.webhooks.deliveries import PENDING, delivery_log
from core.webhooks.endpoints import count_endpoints, create_endpoint, get_endpoint, update_endpoint
from core.webhooks.outbox import TEST_EVENT, record_event


def visible_endpoint(session: Session, caller: Caller, endpoint_id: str) -> WebhookEndpoint:
    """The endpoint, if this caller may see it; NotFound otherwise (another's reads as missing)."""
    endpoint = get_endpoint(session, endpoint_id=endpoint_id)
    if endpoint is None or not caller.can_see(endpoint.owner):
        raise NotFound(f"no webhook endpoint {endpoint_id}")
    return endpoint


def check_url(settings: Settings, url: str) -> None:
    """422 on `url` unless it is an http(s) URL whose host resolves to addresses a webhook may
    reach now (the dispatcher checks again before every delivery)."""
    try:
        checked_target(url, AddressPolicy.from_setting(settings.webhook_allow_hosts))
    except UnsafeUrl as e:
        problem = {"loc": ["body", "url"], "msg": str(e), "type": "unsafe_url", "input": url}
        raise InvalidRequest([problem]) from e


def create(
    session: Session, settings: Settings, caller: Caller, body: WebhookIn
) -> WebhookEndpoint:
    """A new endpoint of the caller's, committed; 429 past the key's bound."""
    check_url(settings, body.url)
    lock_owner(session, caller.owner)  # two creations at once count each other
    have, limit = (
        count_endpoints(session, owner=caller.owner),
        settings.webhook_max_endpoints_per_key,
    )
    if have >= limit:
        raise QuotaExceeded(
            f"key {caller.owner} has {have} webhook endpoints, its limit "
            "(TRAINQ_WEBHOOK_MAX_ENDPOINTS_PER_KEY): delete one first",
            limit="webhook_max_endpoints_per_key",
            value=limit,
            usage=have,
            owner=caller.owner,
            retry_after_s=None,
        )
    events = [e.value for e in body.events]
    endpoint = create_endpoint(
        session, owner=caller.owner, url=body.url, events=events, description=body.description
    )
    session.commit()
    return endpoint


def change(
    session: Session, settings: Settings, caller: Caller, endpoint_id: str, patch: WebhookPatch
) -> WebhookEndpoint:
    endpoint = visible_endpoint(session, caller, endpoint_id)
    changes: dict[str, Any] = patch.model_dump(mode="json", exclude_unset=True)
    if "url" in changes:
        check_url(settings, changes["url"])
    update_endpoint(session, endpoint, changes)
    session.commit()
    return endpoint


def send_test(session: Session, caller: Caller, endpoint_id: str) -> str:
    """A `webhook.test` event to this endpoint alone, through the outbox as every event goes;
    its id. 409 for an endpoint that takes no deliveries now."""
    endpoint = visible_endpoint(session, caller, endpoint_id)
    if not endpoint.enabled or endpoint.failing_since is not None:
        state = "disabled" if not endpoint.enabled else f"failing ({endpoint.failing_reason})"
        raise EndpointDisabled(
            f"webhook endpoint {endpoint_id} is {state}: enable it first (PATCH enabled=true)"
        )
    data = {"endpoint_id": endpoint.id, "message": "a test event from trainq"}
    event_id = record_event(
        session, owner=endpoint.owner, type=TEST_EVENT, data=data, endpoint_id=endpoint.id
    )
    session.commit()
    assert event_id is not None  # the endpoint is enabled, and named
    return event_id


def endpoint_out(endpoint: WebhookEndpoint) -> WebhookOut:
    return WebhookOut(
        id=endpoint.id,
        url=endpoint.url,
        events=list(endpoint.events),
        description=endpoint.description,
        enabled=endpoint.enabled,
        failing_since=as_utc(endpoint.failing_since),
        failing_reason=endpoint.failing_reason,
        created_at=as_utc(endpoint.created_at) or endpoint.created_at,
        updated_at=as_utc(endpoint.updated_at) or endpoint.updated_at,
        links={
            "self": f"/webhooks/{endpoint.id}",
            "deliveries": f"/webhooks/{endpoint.id}/deliveries",
            "test": f"/webhooks/{endpoint.id}/test",
        },
    )


def deliveries_page(
    session: Session, caller: Caller, endpoint_id: str, cursor: str | None, limit: int
) -> DeliveryPage:
    """The endpoint's delivery log, newest first; `cursor`, a previous page's `next`."""
    endpoint = visible_endpoint(session, caller, endpoint_id)
    found = delivery_log(
        session, endpoint_id=endpoint.id, before=int(cursor) if cursor else None, limit=limit + 1
    )
    items = [_delivery_out(d, kind) for d, kind in found[:limit]]
    return DeliveryPage(items=items, next=str(items[-1].id) if len(found) > limit else None)


def _delivery_out(d: Any, kind: str) -> DeliveryOut:
    return DeliveryOut(
        id=d.id,
        event_id=d.event_id,
        type=kind,
        status=d.status,
        status_code=d.last_status_code,
        latency_ms=d.latency_ms,
        attempts=d.attempts,
        next_attempt_at=as_utc(d.next_attempt_at) if d.status == PENDING else None,
        last_error=d.last_error,
        created_at=as_utc(d.created_at) or d.created_at,
        last_attempt_at=as_utc(d.last_attempt_at),
        delivered_at=as_utc(d.delivered_at),
    )

"""What the /webhooks routes do: an endpoint registered within its key's bound after its URL's
addresses are checked (core.webhooks.addresses), looked up as its key may see it, changed,
removed, sent a test event through the outbox, and its delivery log read; delivery as a whole
paused and resumed by an admin (core.webhooks.delivery_state). See docs/api.md ("Webhooks")."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy.orm import Session

from api.auth import Caller
from api.webhook_schemas import (
    DeliveryOut,
    DeliveryPage,
    DeliveryStateOut,
    WebhookIn,
    WebhookList,
    WebhookOut,
    WebhookPatch,
)
from core.config import Settings
from core.db import Database, WebhookEndpoint, as_utc
from core.errors import EndpointDisabled, InvalidRequest, NotFound, QuotaExceeded
from core.quotas import lock_owner
from core.webhooks.addresses import AddressPolicy, UnsafeUrl, checked_target
from core.webhooks.deliveries import PENDING, delivery_log, waiting
from core.webhooks.delivery_state import (
    DeliveryState,
    delivery_state,
    pause_delivery,
    resume_delivery,
)
from core.webhooks.endpoints import (
    count_endpoints,
    create_endpoint,
    get_endpoint,
    list_endpoints,
    update_endpoint,
)
from core.webhooks.outbox import TEST_EVENT, record_event

log = logging.getLogger("trainq.api")


MAX_TEST_EVENTS_WAITING = 20  # one endpoint's test events not yet delivered


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
    its id. 409 for an endpoint that takes no deliveries now; 429 past
    MAX_TEST_EVENTS_WAITING not yet delivered (they would be held and retried for a day,
    each a row, asked for with no work of the service's behind it)."""
    endpoint = visible_endpoint(session, caller, endpoint_id)
    if not endpoint.enabled or endpoint.failing_since is not None:
        state = "disabled" if not endpoint.enabled else f"failing ({endpoint.failing_reason})"
        raise EndpointDisabled(
            f"webhook endpoint {endpoint_id} is {state}: enable it first (PATCH enabled=true)"
        )
    held = waiting(session, endpoint_id=endpoint.id, event_type=TEST_EVENT)
    if held >= MAX_TEST_EVENTS_WAITING:
        raise QuotaExceeded(
            f"webhook endpoint {endpoint_id} has {held} test events not yet delivered: at "
            f"most {MAX_TEST_EVENTS_WAITING} (is its receiver answering?)",
            limit="test events waiting for one endpoint", value=MAX_TEST_EVENTS_WAITING,
            usage=held, owner=endpoint.owner, retry_after_s=60,
        )  # fmt: skip
    data = {"endpoint_id": endpoint.id, "message": "a test event from trainq"}
    event_id = record_event(
        session, owner=endpoint.owner, type=TEST_EVENT, data=data, endpoint_id=endpoint.id
    )
    session.commit()
    assert event_id is not None  # the endpoint is enabled, and named
    return event_id


def listing(session: Session, caller: Caller) -> WebhookList:
    """The caller's endpoints (an admin's: everyone's), and whether delivery is paused."""
    found = list_endpoints(session, owner=caller.owner, all_owners=caller.admin)
    state = delivery_out(delivery_state(session), admin=caller.admin)
    return WebhookList(items=[endpoint_out(e) for e in found], delivery=state)


def pause(session: Session, caller: Caller, reason: str | None) -> DeliveryStateOut:
    """Delivery paused (an admin's route), committed; paused already: unchanged."""
    pause_delivery(session, by=caller.owner, reason=reason)
    session.commit()
    return delivery_out(delivery_state(session), admin=True)


def resume(session: Session) -> DeliveryStateOut:
    """Delivery resumed (an admin's route), committed; what was held goes, oldest first."""
    resume_delivery(session)
    session.commit()
    return delivery_out(delivery_state(session), admin=True)


class DeliveryWatch:
    """Delivery's state as /health shows it (no key: not who paused it, nor why), read in a
    thread of its own at most once every `fresh_s` and never waited for: a look answers the
    last read, None before the first ends or once the last is `stale_s` old (its database
    stalls or fails), so a slow database never slows /health."""

    def __init__(self, db: Database, fresh_s: float = 1.0, stale_s: float = 5.0) -> None:
        self.db, self.fresh_s, self.stale_s = db, fresh_s, stale_s
        self._lock = threading.Lock()
        self._reading = False  # one read at a time: one stuck on a stalled server is enough
        self._asked = -fresh_s  # time.monotonic() of the last read started
        self._last: tuple[float, DeliveryStateOut] | None = None

    def look(self) -> DeliveryStateOut | None:
        with self._lock:
            if not self._reading and time.monotonic() - self._asked >= self.fresh_s:
                self._reading, self._asked = True, time.monotonic()
                threading.Thread(target=self._read, name="health-webhooks", daemon=True).start()
            if self._last is None or time.monotonic() - self._last[0] > self.stale_s:
                return None
            return self._last[1]

    def _read(self) -> None:
        try:
            with self.db.reader() as s:
                seen = delivery_out(delivery_state(s), admin=False)
            with self._lock:
                self._last = (time.monotonic(), seen)
        except Exception as e:  # the database away: /health says so of the database itself
            log.warning("health: webhook delivery's state was not read: %s", e)
        finally:
            with self._lock:
                self._reading = False


_watches: WeakKeyDictionary[Database, DeliveryWatch] = WeakKeyDictionary()
_watches_lock = threading.Lock()


def delivery_watch(db: Database) -> DeliveryWatch:
    """The one DeliveryWatch of this process's `db` (an app's)."""
    with _watches_lock:
        return _watches.setdefault(db, DeliveryWatch(db))


def delivery_out(state: DeliveryState, *, admin: bool) -> DeliveryStateOut:
    """Who paused it, and why, for an admin alone."""
    return DeliveryStateOut(
        status=state.status.value,
        paused=state.paused,
        paused_at=state.paused_at,
        paused_by=state.paused_by if admin else None,
        reason=state.reason if admin else None,
        since_dispatch_s=state.since_dispatch_s,
    )


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

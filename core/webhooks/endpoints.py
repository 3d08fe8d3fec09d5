"""The endpoint rows: made with a new secret, listed, changed, removed (their deliveries with
them). Keyword-only functions over a Session, as core.store's are."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from core.db import WebhookEndpoint, utcnow
from core.webhooks.deliveries import restart_retries
from core.webhooks.signing import new_secret


def create_endpoint(
    s: Session, *, owner: str, url: str, events: Sequence[str], description: str | None
) -> WebhookEndpoint:
    now = utcnow()
    endpoint = WebhookEndpoint(
        id=str(uuid.uuid4()),
        owner=owner,
        url=url,
        events=list(events),
        description=description,
        secret=new_secret(),
        enabled=True,
        created_at=now,
        updated_at=now,
    )
    s.add(endpoint)
    s.flush()
    return endpoint


def get_endpoint(s: Session, *, endpoint_id: str) -> WebhookEndpoint | None:
    return s.get(WebhookEndpoint, endpoint_id)


def list_endpoints(s: Session, *, owner: str, all_owners: bool) -> Sequence[WebhookEndpoint]:
    """Oldest first: a key has few (Settings.webhook_max_endpoints_per_key)."""
    q = select(WebhookEndpoint)
    if not all_owners:
        q = q.where(WebhookEndpoint.owner == owner)
    return s.scalars(q.order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)).all()


def count_endpoints(s: Session, *, owner: str) -> int:
    q = select(func.count()).select_from(WebhookEndpoint).where(WebhookEndpoint.owner == owner)
    return int(s.scalar(q) or 0)


def update_endpoint(s: Session, endpoint: WebhookEndpoint, changes: dict[str, Any]) -> None:
    """Apply `changes` (url, events, description, enabled); enabling an endpoint that was
    disabled or failing clears its failing mark, and what it held goes at once, oldest
    first, each with a new day of retries."""
    stopped = not endpoint.enabled or endpoint.failing_since is not None
    for name, value in changes.items():
        setattr(endpoint, name, list(value) if name == "events" else value)
    if changes.get("enabled") is True and stopped:
        endpoint.failing_since = None
        endpoint.failing_reason = None
        restart_retries(s, endpoint_id=endpoint.id)
    endpoint.updated_at = utcnow()
    s.flush()


def delete_endpoint(s: Session, *, endpoint_id: str) -> None:
    """The endpoint and its deliveries (a foreign key's cascade)."""
    s.execute(delete(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id))

"""Webhook endpoints through the HTTP API: `Webhooks(client)` registers, lists, changes and
removes a key's endpoints, sends a test event and reads the delivery log; an admin key pauses
and resumes delivery. See docs/api.md ("Webhooks")."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from client.http import Client


class Webhooks:
    def __init__(self, client: Client) -> None:
        self.client = client

    def add(
        self, url: str, events: Sequence[str], description: str | None = None
    ) -> dict[str, Any]:
        """A new endpoint; its answer holds the signing `secret`, shown this once."""
        body = {"url": url, "events": list(events), "description": description}
        return self.client._object(self.client.http.post("/webhooks", json=body))

    def list(self) -> list[dict[str, Any]]:
        return list(self.listing()["items"])

    def listing(self) -> dict[str, Any]:
        """{"items": the key's endpoints, "delivery": whether delivery is paused, alive}."""
        return self.client._object(self.client.http.get("/webhooks"))

    def pause(self, reason: str | None = None) -> dict[str, Any]:
        """Hold every delivery, every key's, until resume (an admin key's call)."""
        body = {"reason": reason} if reason is not None else None
        return self.client._object(self.client.http.post("/webhooks/pause", json=body))

    def resume(self) -> dict[str, Any]:
        """Deliver again what was held (an admin key's call)."""
        return self.client._object(self.client.http.post("/webhooks/resume"))

    def get(self, endpoint_id: str) -> dict[str, Any]:
        return self.client._object(self.client.http.get(f"/webhooks/{endpoint_id}"))

    def change(self, endpoint_id: str, **changes: Any) -> dict[str, Any]:
        """url, events, description, enabled (True also clears a failing mark)."""
        answer = self.client.http.patch(f"/webhooks/{endpoint_id}", json=changes)
        return self.client._object(answer)

    def remove(self, endpoint_id: str) -> None:
        answer = self.client.http.delete(f"/webhooks/{endpoint_id}")
        if answer.status_code != 204:
            self.client._json(answer)  # raises ApiError

    def test(self, endpoint_id: str) -> dict[str, Any]:
        """A `webhook.test` event to this endpoint: {"event_id", "links"}."""
        return self.client._object(self.client.http.post(f"/webhooks/{endpoint_id}/test"))

    def deliveries(self, endpoint_id: str, limit: int = 20) -> Iterator[dict[str, Any]]:
        """The endpoint's delivery log, newest first, following the cursors."""
        return self.client._pages(f"/webhooks/{endpoint_id}/deliveries", {"limit": limit})

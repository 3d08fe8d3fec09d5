"""`trainq webhook`: a key's webhook endpoints from the shell (add, ls, rm, test, deliveries,
enable), and delivery paused or resumed with an admin key (pause, resume). Light, like the
other client commands. See docs/api.md ("Webhooks")."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cli.client_cmd import client
from cli.table import aligned, cell
from client.http import IdNotFound
from client.webhooks import Webhooks


def webhook_command(args: argparse.Namespace) -> int:
    with client(args) as c:
        hooks = Webhooks(c)
        command = args.webhook_command
        if command == "add":
            return add(hooks, args)
        if command == "ls":
            return listing(hooks)
        if command in ("pause", "resume"):
            state = hooks.pause(args.reason) if command == "pause" else hooks.resume()
            print(delivery_line(state))
            return 0
        endpoint_id = whole_id(hooks, args.webhook_id)
        if command == "rm":
            hooks.remove(endpoint_id)
        elif command == "test":
            print(hooks.test(endpoint_id)["event_id"])
        elif command == "enable":
            hooks.change(endpoint_id, enabled=True)
        else:
            return delivery_log(hooks, endpoint_id, args.limit)
        return 0


def add(hooks: Webhooks, args: argparse.Namespace) -> int:
    made = hooks.add(args.url, args.events, args.description)
    print(made["id"])
    print(
        f"secret {made['secret']} (shown this once: it verifies each delivery's signature)",
        file=sys.stderr,
    )
    return 0


def listing(hooks: Webhooks) -> int:
    found = hooks.listing()
    rows = [["id", "url", "events", "state"]]
    for e in found["items"]:
        state = "failing" if e["failing_since"] else ("enabled" if e["enabled"] else "disabled")
        rows.append([e["id"], e["url"], cell(e["events"]), state])
    print("\n".join(aligned(rows)))
    if found["delivery"]["paused"]:
        print(delivery_line(found["delivery"]), file=sys.stderr)
    return 0


def delivery_line(state: dict[str, Any]) -> str:
    """Delivery's state in words: paused (since when, by whom, why) or delivering."""
    if not state["paused"]:
        return "webhook delivery is on: held events go, each endpoint's oldest first"
    who = f" by {state['paused_by']}" if state.get("paused_by") else ""
    why = f" ({state['reason']})" if state.get("reason") else ""
    return (
        f"webhook delivery is paused since {state['paused_at']}{who}{why}: every event is "
        "held until `trainq webhook resume`"
    )


def delivery_log(hooks: Webhooks, endpoint_id: str, limit: int) -> int:
    rows = [["event", "type", "status", "code", "ms", "attempts", "next attempt", "error"]]
    for i, d in enumerate(hooks.deliveries(endpoint_id)):
        if i >= limit:
            break
        figures = [d["status_code"], d["latency_ms"], d["attempts"], d["next_attempt_at"]]
        rows.append([d["event_id"], d["type"], d["status"], *map(cell, figures)])
        rows[-1].append((d["last_error"] or "")[:60])
    print("\n".join(aligned(rows)))
    return 0


def whole_id(hooks: Webhooks, given: str) -> str:
    """The id of the key's endpoint whose id is `given` or starts with it."""
    found = [e["id"] for e in hooks.list() if str(e["id"]).startswith(given.lower())]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise IdNotFound(f"{what} webhook endpoints of yours have an id starting {given!r}")
    return str(found[0])

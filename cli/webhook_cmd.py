"""`trainq webhook`: a key's webhook endpoints from the shell (add, ls, rm, test, deliveries,
enable). Light, like the other client commands. See docs/api.md ("Webhooks")."""

from __future__ import annotations

import argparse
import sys

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
    rows = [["id", "url", "events", "state"]]
    for e in hooks.list():
        state = "failing" if e["failing_since"] else ("enabled" if e["enabled"] else "disabled")
        rows.append([e["id"], e["url"], cell(e["events"]), state])
    print("\n".join(aligned(rows)))
    return 0


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

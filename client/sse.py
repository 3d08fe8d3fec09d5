"""Server-Sent Events as the client reads them (a job's events, a sweep's): each event's
id, name and JSON data, from the lines of a streamed response."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def parse_sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    event: dict[str, Any] = {}
    for line in lines:
        if not line:
            if "data" in event:
                event["data"] = json.loads(event["data"])
                event.setdefault("event", "message")
                yield event
            event = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            event[field] = value.removeprefix(" ")

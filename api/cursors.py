"""The cursors of the listings' pages, opaque to clients: a sweep page's is the (created_at,
id) of its last item; a job page's (`JobCursor`) is where its last job stands in the page's
order, with that order and a hash of the filters, so that it is never used with others.
See docs/api.md ("Finding jobs")."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidRequest
from core.store.search import JobFilters, Position, Sort


def encode_cursor(created_at: dt.datetime, item_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{item_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[str, str]:
    """(created_at iso, id); a 422 on `cursor` for anything not made by encode_cursor."""
    try:
        created, _, item_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        dt.datetime.fromisoformat(created)
        uuid.UUID(item_id)
    except (ValueError, binascii.Error, UnicodeDecodeError) as e:
        raise _bad_cursor("not a cursor from a previous page") from e
    return created, item_id


@dataclass(frozen=True)
class JobCursor:
    """Where a page of GET /jobs ended, and the listing it belongs to: its order and a hash
    of its filters (JobFilters.digest)."""

    sort: Sort
    filters: str
    position: Position

    def encode(self) -> str:
        value = self.position.value
        body = {
            "o": str(self.sort),
            "f": self.filters,
            "v": value.isoformat() if isinstance(value, dt.datetime) else value,
            "i": self.position.job_id,
        }
        text = json.dumps(body, separators=(",", ":"))
        return base64.urlsafe_b64encode(text.encode()).decode()

    @classmethod
    def decode(cls, cursor: str, sort: Sort, filters: JobFilters) -> Position:
        """The position `cursor` marks in the listing of `sort` and `filters`; a 422 on
        `cursor` for one not made by `encode`, or made for another order or other filters.
        A cursor of the pages before the search (created_at|id) is read as a newest-first
        one, with its filters unchecked, as they were then."""
        try:
            text = base64.urlsafe_b64decode(cursor.encode()).decode()
            if not text.startswith("{"):
                created, item_id = decode_cursor(cursor)
                body: Any = {"o": "-created", "f": filters.digest(), "v": created, "i": item_id}
            else:
                body = json.loads(text)
            position = _position(body, sort)
        except (ValueError, TypeError, KeyError, binascii.Error, UnicodeDecodeError) as e:
            raise _bad_cursor("not a cursor from a previous page") from e
        if body["o"] != str(sort) or body["f"] != filters.digest():
            raise _bad_cursor(
                "this cursor is from a listing with another order or other filters: send "
                "the same sort and filters as the page it came from, or start again without it"
            )
        return position


def _position(body: dict[str, Any], sort: Sort) -> Position:
    value = body["v"]
    job_id = str(uuid.UUID(body["i"]))
    if sort.key.figure:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("a figure's cursor holds a number")
        return Position(float(value), job_id)
    return Position(dt.datetime.fromisoformat(value), job_id)


def _bad_cursor(message: str) -> InvalidRequest:
    # Shaped like FastAPI's own 422s, as documented: the field named in `loc`.
    return InvalidRequest([{"loc": ["query", "cursor"], "msg": message, "type": "value_error"}])

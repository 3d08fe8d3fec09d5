"""The cursor of a listing's pages (/jobs, /sweeps): the (created_at, id) of a page's last
item, opaque to clients. See docs/api.md."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import uuid

from core.errors import InvalidRequest


def encode_cursor(created_at: dt.datetime, item_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{item_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[str, str]:
    """(created_at iso, id); a 422 on `cursor` for anything not made by encode_cursor."""
    try:
        created, _, item_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        dt.datetime.fromisoformat(created)
        uuid.UUID(item_id)
    except (ValueError, binascii.Error, UnicodeDecodeError) as e:
        # Shaped like FastAPI's own 422s, as documented: the field named in `loc`.
        problem = {
            "loc": ["query", "cursor"],
            "msg": "not a cursor from a previous page",
            "type": "value_error",
        }
        raise InvalidRequest([problem]) from e
    return created, item_id

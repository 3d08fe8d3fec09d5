"""Idempotency-Key: a create sent again with the same key (and owner) gets the first
answer, 200 instead of 201; with another body, 409. Jobs find their key inside the
submitter's batch (api.services.submitter); sweeps through `create_once`. See docs/api.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.errors import IdempotencyKeyReused


class Created(Protocol):
    """A row made by a create that took an Idempotency-Key."""

    id: Any
    request_hash: Any


T = TypeVar("T")


def create_once(
    session: Session, key: str | None, find: Callable[[], T | None], create: Callable[[], T]
) -> tuple[T, bool]:
    """The row `create` makes and commits, and True; or, with a key, the row that key made
    before, and False: found first, or found after losing the race for the key to another
    request (the unique index refuses our insert)."""
    if key is not None:
        found = find()
        if found is not None:
            return found, False
    try:
        return create(), True
    except IntegrityError:  # the same key, used at the same moment in another request
        session.rollback()
        found = find()
        if found is None:
            raise
        return found, False


def answer_again(
    found: Created, body_hash: str, body: Callable[[], Any], *, what: str, noun: str
) -> JSONResponse:
    """The answer to a create that found its key's row: that row (200, its Location) if it
    was made from the same body, else IdempotencyKeyReused (409)."""
    if found.request_hash != body_hash:
        raise IdempotencyKeyReused(
            f"this Idempotency-Key was already used with a different {what}; use a new key "
            f"for a new {noun}"
        )
    return JSONResponse(body(), status_code=200, headers={"Location": f"/{noun}s/{found.id}"})

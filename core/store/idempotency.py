"""The row an owner's earlier create made with an Idempotency-Key (a job or a sweep): the
unique index on (owner, idempotency_key) holds one at most. See docs/api.md."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import Job, Sweep

Keyed = TypeVar("Keyed", Job, Sweep)


def by_idempotency_key(
    s: Session, table: type[Keyed], *, owner: str | None, key: str
) -> Keyed | None:
    """`owner`'s row of `table` made with `key` (owner None: the admins' rows)."""
    return s.scalars(
        select(table)
        .where(table.owner.is_(None) if owner is None else table.owner == owner)
        .where(table.idempotency_key == key)
    ).first()

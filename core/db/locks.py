"""Named locks that serialise decisions across processes for one transaction: PostgreSQL's
advisory locks; SQLite needs none (its writers already take turns). See docs/operations.md."""

from __future__ import annotations

import hashlib

from sqlalchemy import text
from sqlalchemy.orm import Session


def lock_name(s: Session, name: str) -> None:
    """Hold the lock called `name` until this transaction ends, so that transactions that
    decide on the same thing from different processes do so one after another.
    PostgreSQL: a transaction-level advisory lock on a hash of the name; SQLite: nothing to
    do, its writers already run one at a time (BEGIN IMMEDIATE)."""
    if s.get_bind().dialect.name != "postgresql":
        return
    s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": advisory_key(name)})


def advisory_key(name: str) -> int:
    """PostgreSQL's advisory lock key for the lock called `name`: a hash of the name."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)

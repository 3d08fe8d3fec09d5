"""Database writes of a running attempt, retried through a blip: a lost connection, a server
failing over, a full disk, a lock held too long. See docs/jobs.md."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from core.db import Database

log = logging.getLogger("trainq.worker")
RETRY_FIRST_S = 0.1  # a database write's first retry; the pause doubles up to RETRY_MAX_S
RETRY_MAX_S = 2.0
T = TypeVar("T")


class DatabaseAway(Exception):
    """A write of a running attempt kept failing with a transient database error for about
    the heartbeat timeout: the attempt gives the job up to the reconciler."""


# SQLite's errors that pass (a full disk freed, a lock released); its other operational
# errors (a missing table, a read-only file) would only come back.
_SQLITE_TRANSIENT = ("database or disk is full", "locked", "disk i/o error")


def is_transient(e: SQLAlchemyError) -> bool:
    """A database error that a retry of the same write may outlive: a lost connection, a
    server restarting or failing over, a full disk, a lock held too long."""
    if isinstance(e, DBAPIError) and e.connection_invalidated:
        return True
    if not isinstance(e, OperationalError | InterfaceError):
        return False
    if isinstance(e.orig, sqlite3.Error):
        return any(m in str(e.orig).lower() for m in _SQLITE_TRANSIENT)
    return True


def retry_write(write: Callable[[Session], T], db: Database, for_s: float, what: str) -> T:
    """`write` in a transaction of its own, again with back-off while it fails transiently,
    for up to `for_s`; then DatabaseAway. Every write retried so is idempotent (a re-run
    replaces what a committed one whose reply was lost stored); JobSuperseded passes."""
    deadline = time.monotonic() + for_s
    pause = RETRY_FIRST_S
    while True:
        try:
            with db.writer() as s:
                return write(s)
        except SQLAlchemyError as e:
            if not is_transient(e):
                raise
            cause = e.orig if isinstance(e, DBAPIError) else e  # not the statement's bytes
            if time.monotonic() + pause > deadline:
                raise DatabaseAway(f"{what}: {type(cause).__name__}: {cause}"[:500]) from e
            log.warning("%s failed (%s); trying again in %.1f s", what, cause, pause)
        time.sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)

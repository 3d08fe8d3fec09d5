"""`read`, the one way async code reads the database: a read-only session in the thread
pool, so that a slow read never stalls the event loop. See docs/api.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from core.db import Database

P = ParamSpec("P")
T = TypeVar("T")


async def read(
    db: Database, fn: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """`fn(session, *args, **kwargs)` with a read-only session, in the thread pool: a read
    on the event loop would stall every other request while it waits for the database."""

    def in_reader() -> T:
        with db.reader() as session:
            return fn(session, *args, **kwargs)

    return await run_in_threadpool(in_reader)

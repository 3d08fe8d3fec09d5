"""The heartbeat thread of a running attempt, against a real database: it beats while the
trainer makes progress, goes silent once it has made none for the stall bound, carries the
cancel flag, stops when the attempt no longer owns its job, outlives a locked SQLite, and
writes a stop request into the job row at once."""

from __future__ import annotations

import datetime as dt
import sqlite3
import threading
import time
from collections.abc import Iterator

import pytest

from core.db import Database, as_utc
from core.store import get_job, request_cancel, requeue_job
from tests.db import migrated, running_job
from tests.service import wait_until
from worker.heartbeat import Heartbeat

EVERY_S = 0.1


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[Database]:
    """SQLite's lock is waited out for 0.2 s only: the locked-database case needs it short."""
    with migrated(database_url, busy_timeout_s=0.2) as database:
        yield database


def last_beat(db: Database, job_id: str) -> dt.datetime:
    with db.writer() as s:
        job = get_job(s, job_id=job_id)
        assert job is not None
        beat = as_utc(job.heartbeat_at)
    assert beat is not None
    return beat


def beats_after(db: Database, job_id: str, t: dt.datetime) -> bool:
    return last_beat(db, job_id) > t


@pytest.fixture
def running(db: Database) -> Iterator[tuple[str, Heartbeat]]:
    job_id = running_job(db)
    heart = Heartbeat(db, job_id=job_id, attempt=1, every_s=EVERY_S, stall_timeout_s=1.0)
    heart.start()
    yield job_id, heart
    heart.stop()


@pytest.mark.slow
def test_it_beats_while_touched_and_goes_silent_after_the_stall_bound(
    db: Database, running: tuple[str, Heartbeat]
) -> None:
    job_id, heart = running
    for _ in range(3):  # a slow phase that reports progress now and then
        seen = last_beat(db, job_id)
        wait_until(lambda t=seen: beats_after(db, job_id, t), 5, "a heartbeat")
        heart.touch()
    time.sleep(1.5)  # no progress for longer than the stall bound: hung
    silent = last_beat(db, job_id)
    time.sleep(10 * EVERY_S)
    assert last_beat(db, job_id) == silent
    heart.touch()  # moving again before anyone declared it lost: it beats again
    wait_until(lambda: beats_after(db, job_id, silent), 5, "the heartbeat to resume")


def test_it_carries_the_cancel_flag(db: Database, running: tuple[str, Heartbeat]) -> None:
    job_id, heart = running
    with db.writer() as s:
        request_cancel(s, job_id=job_id)
    wait_until(lambda: heart.cancel_requested, 5, "the cancel flag")


def test_it_stops_once_the_attempt_no_longer_owns_the_job(
    db: Database, running: tuple[str, Heartbeat]
) -> None:
    job_id, heart = running
    with db.writer() as s:
        assert requeue_job(
            s,
            job_id=job_id,
            attempt=1,
            queue_entry=f"{job_id}-a2",
            silent_since=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1),
        )
    wait_until(lambda: heart.superseded, 5, "the attempt to see it was superseded")


def test_a_locked_sqlite_skips_beats_and_never_stops_the_heart(
    db: Database, running: tuple[str, Heartbeat], database_url: str
) -> None:
    if not db.local:
        pytest.skip("SQLite's database lock")
    job_id, heart = running
    lock = sqlite3.connect(database_url.removeprefix("sqlite:///"), isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # another process writing, past the busy timeout
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            heart.touch()
            time.sleep(EVERY_S)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    released = last_beat(db, job_id)
    heart.touch()
    wait_until(lambda: beats_after(db, job_id, released), 5, "a beat after the lock")


def test_a_stop_request_reaches_the_job_row_long_before_the_next_beat(db: Database) -> None:
    job_id = running_job(db)
    asked = threading.Event()  # what the SIGTERM handler sets
    heart = Heartbeat(
        db, job_id=job_id, attempt=1, every_s=60, stall_timeout_s=60, stop_asked=asked.is_set
    )
    heart.start()
    try:
        asked.set()

        def recorded() -> bool:
            with db.writer() as s:
                job = get_job(s, job_id=job_id)
                return job is not None and job.stop_requested_attempt == 1

        wait_until(recorded, 5, "the stop request in the job row")
    finally:
        heart.stop()

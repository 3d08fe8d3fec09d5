"""The job stream's writes against a real redis-server: fenced by attempt, idempotent per
entry, always closable, expiring; the worker's publisher through faults at the wire, and
through a Redis that forgot its fences (its proof of ownership from a real database)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from core.db import Database, utcnow
from core.schema import upgrade
from core.spec import JobSpec, JobStatus
from core.store import claim_job, create_job, end_job, requeue_job
from core.stream import (
    FINISHED_TTL_S,
    LIVE_TTL_S,
    EntryId,
    InvalidEntryId,
    Outcome,
    Publisher,
    ask_to_stop,
    attempt_key,
    cancel_key,
    epoch_entry,
    latest_step,
    publish_status,
    publish_steps,
    read,
    status_entry,
    step_entries,
    stream_key,
)
from core.train import EpochMetrics, StepMetrics
from tests.service import RedisServer
from tests.wire import WireProxy
from worker.attempt import job_row

RUNNING = {"status": "running"}


def owning(attempt: int = 1) -> Any:
    """The row of a job that `attempt` runs: for publishers whose fence is never lost."""
    return lambda: (attempt, JobStatus.running)


def point(step: int) -> StepMetrics:
    return StepMetrics(step, 1, 0.5, 1e-3, 1000.0, 0, 0, 0, 1.0)


def points(first: int, last: int) -> list[StepMetrics]:
    return [point(s) for s in range(first, last + 1)]


def epoch_end(epoch: int, step: int) -> EpochMetrics:
    return EpochMetrics(epoch, step, 0.4, 0.9, 0.3, 0.91, 1.0, 1000.0)


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def job() -> str:
    return str(uuid.uuid4())


def ids(r: Redis, job_id: str) -> list[str]:
    return [entry_id for entry_id, _, _ in read(r, job_id, None, 100_000)]


def test_an_entry_id_reads_back_as_written_and_junk_is_refused() -> None:
    assert str(EntryId(12, 3)) == "12-3" and EntryId.parse("12-3") == EntryId(12, 3)
    assert EntryId.parse("007-0") == EntryId(7, 0)
    assert EntryId(2, 0) < EntryId(2, 1) < EntryId(3, 0)
    assert EntryId(5, 1).exclusive() == "(5-1"
    assert EntryId.parse("2147483647-3") == EntryId(2**31 - 1, 3)  # every id a route may send
    for junk in (
        "",
        "1",
        "1-",
        "-1",
        "1-10",
        "1-a",
        "1_0",
        "1-0\n",
        " 1-0",
        "2147483648-0",
        "12345678901-0",
    ):
        with pytest.raises(InvalidEntryId):
            EntryId.parse(junk)


def test_an_entry_written_twice_is_skipped_not_an_error(r: Redis, job: str) -> None:
    publish_status(r, job, 0, RUNNING, attempt=1)
    publish_steps(r, job, points(1, 5), 1000, attempt=1)
    # The same block again (its reply was lost), overlapping the next one.
    assert publish_steps(r, job, points(3, 8), 1000, attempt=1) is Outcome.WRITTEN
    assert ids(r, job) == ["0-2"] + [f"{s}-0" for s in range(1, 9)]


def test_a_stale_attempts_write_is_refused(r: Redis, job: str) -> None:
    publish_status(r, job, 0, RUNNING, attempt=1)
    publish_steps(r, job, points(1, 40), 1000, attempt=1)
    # Attempt 2 resumes after step 32: attempt 1's steps past it are gone.
    assert publish_status(r, job, 32, RUNNING, attempt=2) is Outcome.WRITTEN
    assert ids(r, job)[-2:] == ["32-0", "32-2"]
    # Attempt 1 comes back: nothing of it lands, by step, epoch or status.
    assert publish_steps(r, job, points(41, 45), 1000, attempt=1) is Outcome.SUPERSEDED
    end = {"status": "failed", "error": {"code": "x", "message": "stale"}}
    assert publish_status(r, job, 45, end, attempt=1) is Outcome.SUPERSEDED
    assert ids(r, job)[-1] == "32-2"
    assert publish_steps(r, job, points(33, 34), 1000, attempt=2) is Outcome.WRITTEN
    assert ids(r, job)[-3:] == ["32-2", "33-0", "34-0"]
    assert int(r.get(attempt_key(job)) or 0) == 2


def test_the_end_is_always_accepted_and_closes_the_stream(r: Redis, job: str) -> None:
    publish_status(r, job, 0, RUNNING, attempt=1)
    publish_steps(r, job, points(1, 45), 1000, attempt=1)
    ask_to_stop(r, job)
    assert 0 < r.ttl(stream_key(job)) <= LIVE_TTL_S
    assert 0 < r.ttl(attempt_key(job)) <= LIVE_TTL_S
    # The database knows only step 32 (the last epoch): the end lands above the top.
    end = {"status": "failed", "error": {"code": "worker_lost", "message": "lost"}}
    assert publish_status(r, job, 32, end, attempt=1) is Outcome.WRITTEN
    assert ids(r, job)[-2:] == ["45-0", "45-3"]
    assert publish_steps(r, job, points(46, 47), 1000, attempt=1) is Outcome.ENDED
    assert publish_status(r, job, 50, end, attempt=1) is Outcome.ENDED
    assert ids(r, job)[-1] == "45-3"
    for key in (stream_key(job), attempt_key(job), cancel_key(job)):
        assert 0 < r.ttl(key) <= FINISHED_TTL_S, key


def test_the_end_of_a_job_with_no_stream_expires(r: Redis, job: str) -> None:
    canceled = {"status": "canceled", "error": {"code": "canceled", "message": "before"}}
    assert publish_status(r, job, 0, canceled, attempt=0) is Outcome.WRITTEN
    assert ids(r, job) == ["0-3"]
    assert 0 < r.ttl(stream_key(job)) <= FINISHED_TTL_S


def test_the_end_lands_above_an_emptied_stream(r: Redis, job: str) -> None:
    publish_status(r, job, 0, RUNNING, attempt=1)
    publish_steps(r, job, points(1, 20), 1000, attempt=1)
    r.xtrim(stream_key(job), maxlen=0, approximate=False)  # entries gone, the last id stays
    assert publish_status(r, job, 0, {"status": "succeeded"}, attempt=1) is Outcome.WRITTEN
    assert ids(r, job) == ["20-3"]


def payloads(r: Redis, job_id: str) -> list[dict[str, Any]]:
    return [data for _, _, data in read(r, job_id, None, 100_000)]


def test_a_batch_sent_again_after_its_reply_was_lost_does_not_jam_the_publisher(
    redis_server: RedisServer, job: str
) -> None:
    proxy = WireProxy(redis_server.port).start()
    through = Redis.from_url(proxy.url, socket_timeout=5)
    try:
        pub = Publisher(through, job, 1, 1000, owning())
        pub.add([status_entry(0, RUNNING)])
        assert pub.flush()
        for block in range(4):
            if block == 1:
                proxy.drop_reply(b":events")  # the script runs; its reply never comes
            pub.add(step_entries(points(10 * block + 1, 10 * block + 10)))
            if block == 1:
                pub.add([epoch_entry(epoch_end(1, 20))])
            pub.flush(force=True)
        assert proxy.dropped == 1
        assert pub.flush(force=True) and not pub.waiting
    finally:
        through.close()
        proxy.close()
    want = ["0-2"] + [f"{s}-0" for s in range(1, 21)] + ["20-1"]
    want += [f"{s}-0" for s in range(21, 41)]
    assert ids(redis_server.client(), job) == want


def test_epochs_and_steps_wait_out_an_outage_in_order(redis_server: RedisServer, job: str) -> None:
    proxy = WireProxy(redis_server.port).start()
    through = Redis.from_url(proxy.url, socket_timeout=5, socket_connect_timeout=1)
    try:
        pub = Publisher(through, job, 1, 1000, owning())
        pub.add([status_entry(0, RUNNING), *step_entries(points(1, 5))])
        assert pub.flush()
        port = proxy.port
        proxy.close()  # Redis refuses: every call fails at once
        pub.add([*step_entries(points(6, 10)), epoch_entry(epoch_end(1, 10))])
        assert not pub.flush()
        # Backing off: Redis is left alone, for the cancel poll too.
        assert not pub.available() and not pub.cancel_requested()
        pub.add(step_entries(points(11, 12)))
        assert not pub.flush()
        proxy = WireProxy(redis_server.port, port=port).start()
        assert pub.flush(force=True)
    finally:
        through.close()
        proxy.close()
    want = ["0-2"] + [f"{s}-0" for s in range(1, 11)] + ["10-1", "11-0", "12-0"]
    assert ids(redis_server.client(), job) == want
    assert payloads(redis_server.client(), job)[-3]["test_accuracy"] == 0.91


def test_the_backlog_is_bounded_by_the_streams_length(r: Redis, job: str) -> None:
    pub = Publisher(r, job, 1, 1000, owning())
    pub.add([status_entry(0, RUNNING)])
    for first in range(1, 3000, 100):
        pub.add(step_entries(points(first, first + 99)))
    assert len(pub.waiting) == 1000
    assert pub.waiting[0][0] == EntryId(0, 2) and pub.waiting[1][0] == EntryId(2002, 0)
    assert pub.flush()
    assert ids(r, job)[:2] == ["0-2", "2002-0"]


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    url = f"sqlite:///{tmp_path / 'trainq.db'}"
    upgrade(url)
    database = Database(url)
    yield database
    database.dispose()


def claimed(db: Database, job_id: str) -> int:
    with db.writer() as s:
        job = claim_job(s, job_id=job_id, worker="w", device="cpu")
        assert job is not None
        return job.attempt


def test_a_zombie_writes_nothing_after_redis_forgot_the_fence(
    r: Redis, db: Database, job: str
) -> None:
    with db.writer() as s:
        create_job(s, job_id=job, spec=JobSpec(), owner=None)
    first = Publisher(r, job, claimed(db, job), 1000, lambda: job_row(db, job))
    first.add([status_entry(0, RUNNING), *step_entries(points(1, 10))])
    assert first.flush()  # the first write finds no fence: the database vouches for it
    # Attempt 1 is lost (its worker hangs); attempt 2 resumes after step 0.
    with db.writer() as s:
        assert requeue_job(
            s,
            job_id=job,
            attempt=1,
            queue_entry=f"{job}-a2",
            silent_since=utcnow() + dt.timedelta(1),
        )
    second = Publisher(r, job, claimed(db, job), 1000, lambda: job_row(db, job))
    second.add([status_entry(0, RUNNING), *step_entries(points(1, 3))])
    assert second.flush()

    r.flushall()  # Redis restarted empty: the fence is gone with the stream
    first.add(step_entries(points(11, 15)))  # the zombie wakes up first
    assert not first.flush()
    assert first.stopped is Outcome.SUPERSEDED
    assert not r.exists(stream_key(job)) and not r.exists(attempt_key(job))

    second.add(step_entries(points(4, 5)))
    assert second.flush()
    assert ids(r, job) == ["4-0", "5-0"]
    assert int(r.get(attempt_key(job)) or 0) == 2
    assert 0 < r.ttl(attempt_key(job)) <= LIVE_TTL_S

    # The fence lost again (here alone): the zombie's end is refused too ...
    r.delete(attempt_key(job))
    late = Publisher(r, job, 1, 1000, lambda: job_row(db, job))
    late.add([status_entry(15, {"status": "failed"})])
    assert not late.flush(force=True) and late.stopped is Outcome.SUPERSEDED
    # ... while an end the database decided is written without one (the reconciler's).
    with db.writer() as s:
        assert end_job(s, job_id=job, status=JobStatus.failed, code="x", message="lost", attempt=2)
    end = {"status": "failed", "error": {"code": "x", "message": "lost"}}
    assert publish_status(r, job, 5, end, attempt=2) is Outcome.WRITTEN
    assert ids(r, job) == ["4-0", "5-0", "5-3"]


def test_a_publisher_that_cannot_prove_ownership_waits_and_keeps_its_entries(
    r: Redis, job: str
) -> None:
    answers: list[Any] = [RuntimeError("the database is away"), (1, JobStatus.running)]

    def row() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    pub = Publisher(r, job, 1, 1000, row)
    pub.add([status_entry(0, RUNNING), *step_entries(points(1, 3))])
    assert not pub.flush() and pub.stopped is None and len(pub.waiting) == 4
    assert not r.exists(stream_key(job))
    assert pub.flush(force=True)
    assert ids(r, job) == ["0-2", "1-0", "2-0", "3-0"]


def test_an_entry_id_past_any_real_step_is_read_as_redis_holds_it(
    redis_server: RedisServer,
) -> None:
    """Whoever writes to the stream chooses its ids: one past the bounds a client's
    Last-Event-ID is held to is still read (no 500 from the routes that read the stream)."""
    job_id = str(uuid.uuid4())
    point = {f.name: 0 for f in dataclasses.fields(StepMetrics)} | {"step": 1, "loss": 1.0}
    with redis_server.client() as r:
        r.xadd(stream_key(job_id), {"data": json.dumps(point)}, id="1000000000-0")
        assert latest_step(r, job_id) == 1_000_000_000
        assert [kind for _, kind, _ in read(r, job_id, None, 10)] == ["step"]


def test_entries_no_trainq_writer_makes_are_skipped_not_fatal(redis_server: RedisServer) -> None:
    """A kind trainq never writes, a step past any route's bound, or data that is no JSON
    object: whoever wrote it to Redis, readers of the stream skip it and read the rest."""
    job_id = str(uuid.uuid4())
    point = {f.name: 0 for f in dataclasses.fields(StepMetrics)} | {"step": 1, "loss": 1.0}
    with redis_server.client() as r:
        key = stream_key(job_id)
        r.xadd(key, {"data": json.dumps(point)}, id="1-0")
        r.xadd(key, {"data": json.dumps(point)}, id="1-4")
        r.xadd(key, {"data": "not json"}, id="2-0")
        r.xadd(key, {"data": "[1, 2]"}, id="3-0")
        r.xadd(key, {"other": "field"}, id="4-0")
        r.xadd(key, {"data": json.dumps(point)}, id=f"{2**31}-0")
        assert [eid for eid, _, _ in read(r, job_id, None, 10)] == ["1-0"]

"""One fair-share choice against a real Redis and database, without workers: a flood of
direct entries never makes one choice read them all (the choice holds the lock all
workers of the queue share)."""

from __future__ import annotations

import uuid
from typing import Literal

from core.config import Settings
from core.queue import enqueue_jobs, job_queue
from tests.db import migrated
from tests.service import RedisServer
from worker.fair_share import NEW_PAYLOADS_PER_CHOICE, FairShare


def test_a_flood_of_direct_entries_is_read_a_share_at_each_choice(
    database_url: str, redis_server: RedisServer
) -> None:
    r = redis_server.client()
    queue = f"flood-{uuid.uuid4().hex[:8]}"
    flood = 2 * NEW_PAYLOADS_PER_CHOICE + 100
    spec = {"epochs": 1}
    jobs = [(str(uuid.uuid4()), spec, f"owner{i}") for i in range(flood)]
    for i in range(0, flood, 500):
        enqueue_jobs(r, queue=queue, jobs=jobs[i : i + 500], timeout_s=60)
    with migrated(database_url) as db:
        fair = FairShare(r, db, Settings(database_url=database_url), job_queue(r, queue))
        seen = [len(fair.plan()) for _ in range(4)]
    share = NEW_PAYLOADS_PER_CHOICE
    assert seen == [share, 2 * share, flood, flood]


class SlowChoice(FairShare):
    """A choice that outlasts the lock: while it reads, the lock expires and another worker
    takes it (as a database slower than LOCK_TTL_MS would make happen)."""

    def plan(self) -> list[tuple[bytes, str | Literal[False] | None]]:
        self.r.set(self.lock_key, "another worker's token")
        return super().plan()


def test_a_choice_that_outlasts_the_lock_takes_nothing(
    database_url: str, redis_server: RedisServer
) -> None:
    r = redis_server.client()
    queue = job_queue(r, f"slow-{uuid.uuid4().hex[:8]}")
    job_id = str(uuid.uuid4())
    enqueue_jobs(r, queue=queue.name, jobs=[(job_id, {"epochs": 1}, "alice")], timeout_s=60)
    with migrated(database_url) as db:
        slow = SlowChoice(r, db, Settings(database_url=database_url), queue)
        assert slow.take() is None
        assert r.lrange(queue.key, 0, -1) == [job_id.encode()]
        assert r.llen(queue.intermediate_queue_key) == 0
        r.delete(slow.lock_key)
        fair = FairShare(r, db, Settings(database_url=database_url), queue)
        assert fair.take() == job_id.encode()

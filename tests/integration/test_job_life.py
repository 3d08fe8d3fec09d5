"""The life of one job as a state machine (hypothesis): random interleavings of claims,
duplicate deliveries, step blocks, epoch ends, replies lost, workers that die and come back
as zombies, heartbeat timeouts and reconcile passes, preemptions, cancels over HTTP,
resumes from the checkpoint, successes and failures. It drives the real store, stream and
reconciler functions against a real redis-server and a real database, with the API over
real HTTP for cancel, `/metrics` and the event stream.

After every step: a terminal status never reverts; the database and the stream hold what
the attempts that owned the job wrote, each step at most once, and nothing of an attempt
after its successor claimed the job; once the job ended, its stream holds its end (every
follower closes), every key of it in Redis expires, and `/metrics` and SSE give every step
from 1 to the last exactly once, in order.

Runs are derandomized (the same examples on every run, as CI needs) and bounded."""

from collections.abc import Iterator

import httpx
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from core.config import Settings
from core.db import Database
from core.schema import upgrade
from tests.job_life.machine import SILENT_S, JobLife
from tests.job_life.world import World
from tests.service import RedisServer, Service

pytestmark = pytest.mark.slow  # real workers and services: the full run, not --fast

LONG_S = 3600.0  # the heartbeat timeout of a reconcile pass that finds the attempt healthy
RUNS = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
)


@pytest.fixture(scope="module")
def world(
    database_url: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    upgrade(database_url)
    data_dir = tmp_path_factory.mktemp("life")
    # The API's own reconciler stays out of the way: the machine runs reconcile passes itself.
    api = Service(
        data_dir=data_dir,
        database_url=database_url,
        redis=redis_server,
        extra_env={"TRAINQ_RECONCILE_INTERVAL_S": "3600", "TRAINQ_HEARTBEAT_TIMEOUT_S": "3600"},
    )
    api.start_api()
    db = Database(database_url)
    r = redis_server.client()
    http = httpx.Client(
        base_url=api.url, headers={"Authorization": f"Bearer {api.admin_key}"}, timeout=10
    )
    try:
        yield World(
            db=db,
            r=r,
            http=http,
            queue=api.queue,
            beating=Settings(data_dir=data_dir, queue=api.queue, heartbeat_timeout_s=LONG_S),
            silent=Settings(
                data_dir=data_dir, queue=api.queue, heartbeat_timeout_s=SILENT_S, queue_grace_s=0
            ),
        )
    finally:
        http.close()
        r.close()
        db.dispose()
        api.stop()


def test_job_life(world: World) -> None:
    machine = type("JobLifeHere", (JobLife,), {"world": world})
    run_state_machine_as_test(machine, settings=RUNS)

"""A worker stops within docker stop's grace (SIGTERM, then SIGKILL about 10 s later): its
RQ worker once its job has handed back, and its launcher with it. Neither the thread that
hears the worker's command channel (RQ's, waiting on Redis) nor the launcher's periodic
pass (the reconciler: Redis and the database, either of which may be slow to answer) may
hold the exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.faults.process_tree import rq_workers
from tests.service import RedisServer, alive, wait_until
from worker.rq_worker import TrainqWorker

GRACE_S = 10  # docker stop's


def test_the_command_channels_thread_ends_at_once_when_the_worker_stops(tmp_path: Path) -> None:
    """RQ's worker hears its channel on a thread that waits for a message up to a minute,
    and its teardown waits for that thread: once the thread has read its unsubscription, the
    wait is the whole minute, past any stop's grace."""
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    r = redis.client()
    try:
        worker = TrainqWorker(["stop-test"], name="w", connection=r, job_timeout_s=60)
        worker.subscribe()
        wait_until(lambda: worker.pubsub.subscribed, 10, "the subscription")
        worker.pubsub.unsubscribe()  # the thread reads this and waits for a subscription
        wait_until(lambda: not worker.pubsub.subscribed, 10, "the unsubscription to be read")
        began = time.monotonic()
        worker.unsubscribe()
        assert time.monotonic() - began < GRACE_S / 2
        assert not worker.pubsub_thread.is_alive()
    finally:
        r.close()
        redis.kill()


LAUNCHER = textwrap.dedent(
    """
    import sys, time
    from worker.launcher import run_workers

    def reconcile():  # a pass stuck on a database or a Redis that does not answer
        open(sys.argv[2], "w").close()
        time.sleep(120)

    sys.exit(run_workers("cpu", "stop-test", sys.argv[1], reconcile=reconcile))
    """
)


@pytest.mark.slow  # a real RQ worker: the full run, not --fast
def test_a_launcher_in_a_slow_reconcile_pass_stops_with_its_worker(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    in_pass = tmp_path / "in-pass"
    env = os.environ | {"TRAINQ_DATA_DIR": str(tmp_path / "data")}
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, redis.url, str(in_pass)], env=env, start_new_session=True
    )
    try:
        (worker,) = wait_until(lambda: rq_workers(launcher.pid) or None, 60, "the RQ worker")
        wait_until(in_pass.exists, 30, "the reconcile pass to start")
        wait_until(lambda: redis.client().smembers("rq:workers:stop-test"), 60, "registration")
        launcher.send_signal(signal.SIGTERM)
        asked = time.monotonic()
        wait_until(lambda: not alive(worker), 10, "the worker to stop")
        launcher.wait(timeout=5)  # its worker gone, the launcher is not held by the pass
        assert time.monotonic() - asked < 15
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        redis.kill()

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
from redis.exceptions import TimeoutError as RedisTimeout

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
        thread = worker.pubsub_thread
        began = time.monotonic()
        worker.unsubscribe()
        assert time.monotonic() - began < GRACE_S / 2
        assert not thread.is_alive()
    finally:
        r.close()
        redis.kill()


def test_a_worker_stops_with_redis_gone(tmp_path: Path) -> None:
    """Redis killed under a subscribed worker: its stop neither raises (RQ's unsubscribe
    did, on the lost connection, leaving the thread running) nor waits past the grace."""
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    r = redis.client()
    try:
        worker = TrainqWorker(["stop-test"], name="w", connection=r, job_timeout_s=60)
        worker.subscribe()
        wait_until(lambda: worker.pubsub.subscribed, 10, "the subscription")
        redis.kill()
        began = time.monotonic()
        worker.unsubscribe()
        assert time.monotonic() - began < GRACE_S / 2
    finally:
        r.close()
        redis.kill()


def test_the_command_channel_listens_again_after_any_redis_error() -> None:
    """RQ's handler ended the thread on every Redis error but a refused connection: a host
    that stopped answering (a connect that timed out) left the worker deaf to stop-job."""
    handler = TrainqWorker._pubsub_exception_handler
    handler(None, RedisTimeout("connect timed out"), None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        handler(None, ValueError("a bug"), None, None)  # type: ignore[arg-type]


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


LATE_START = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from worker.launcher import run_workers

    def problem():  # a restart's schema check, slow as a database that is away
        Path(sys.argv[2]).touch()
        time.sleep(3)
        return None

    sys.exit(run_workers("cpu", "stop-test", sys.argv[1], schema_problem=problem))
    """
)


@pytest.mark.slow  # real RQ workers: the full run, not --fast
def test_a_worker_restarted_as_the_stop_came_is_stopped_too(tmp_path: Path) -> None:
    """SIGTERM handled while the launcher restarts a worker (its schema check under way):
    the worker it starts next must hear the stop, or the launcher waits for it for ever."""
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    checking = tmp_path / "checking"
    env = os.environ | {"TRAINQ_DATA_DIR": str(tmp_path / "data")}
    cmd = [sys.executable, "-c", LATE_START, redis.url, str(checking)]
    launcher = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        (worker,) = wait_until(lambda: rq_workers(launcher.pid) or None, 60, "the RQ worker")
        os.kill(worker, signal.SIGKILL)
        wait_until(checking.exists, 30, "the restart's check")
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)  # the next worker started, heard the stop, and ended
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        redis.kill()

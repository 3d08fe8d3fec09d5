"""A worker process's loop: RQ's work loop started again whenever Redis fails it (refused,
away, full), so that an outage costs latency, not the process; and the process's quick
exit. See docs/operations.md."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType

from redis import Redis
from redis.exceptions import RedisError
from rq import Worker

log = logging.getLogger("trainq.worker")

RETRY_FIRST_S = 1.0  # Redis away: the first wait before trying again, doubled each time
RETRY_MAX_S = 15.0
UNRECORDED_MAX = 8  # ended runs kept to record; older ones' keys simply expire


def wait_for_redis(r: Redis) -> None:
    """Returns once Redis answers PING, trying again with back-off (1 s doubling to 15 s)."""
    delay = RETRY_FIRST_S
    while True:
        try:
            r.ping()
            return
        except RedisError as e:
            log.warning("Redis does not answer (%s); trying again in %.0f s", e, delay)
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)


def _exit_cleanly(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def asked_to_stop(worker: Worker) -> bool:
    """SIGINT/SIGTERM reached RQ's handler (warm shutdown), busy or idle."""
    return bool(worker._stop_requested or worker._shutdown_requested_date is not None)


def serve(make_worker: Callable[[], Worker], r: Redis, *, burst: bool) -> None:
    """RQ's work loop, started again after Redis failed it (refused, away, full), so that an
    outage costs latency, not the process: RQ quits its loop on any error, and a worker that
    exited would make the launcher restart it over and over. Each run is a fresh RQ worker
    under a fresh name: the last one's key may outlive it (its death went unrecorded)."""
    delay = RETRY_FIRST_S
    unrecorded: list[Worker] = []  # runs whose end Redis failed to take, oldest first
    while True:
        wait_for_redis(r)
        unrecorded = [w for w in unrecorded if not record_end(w)][-UNRECORDED_MAX:]
        try:
            worker = make_worker()  # RQ names its connection here: Redis may be gone again
        except RedisError as e:
            log.warning("Redis failed the worker's start (%s); trying again", e)
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            continue
        began = time.monotonic()
        ended = run(worker, burst=burst)
        if asked_to_stop(worker) or (burst and ended is None):
            return
        # A run that returned was recorded by RQ's teardown; one Redis failed may not be.
        if ended == "failed" and not record_end(worker):
            unrecorded.append(worker)  # again once Redis answers, before the next run
        elif ended == "refused":
            close_channel(worker)  # the name is another's: its registration is left alone
        if time.monotonic() - began > 4 * RETRY_MAX_S:
            delay = RETRY_FIRST_S  # it ran a good while: this is a new outage
        log.warning("the worker loop ended on an error; starting it again in %.0f s", delay)
        time.sleep(delay)
        delay = min(delay * 2, RETRY_MAX_S)


def run(worker: Worker, *, burst: bool) -> str | None:
    """One run of RQ's loop: None when it returned, "failed" when Redis failed it, and
    "refused" when RQ would not start it (register_birth: a registration without a death
    holds its name, a worker's of the same host name and process id elsewhere, or one
    forged by anyone who can write to Redis; the next run takes the next name)."""
    try:
        worker.work(burst=burst, logging_level="INFO", with_scheduler=False)
    except RedisError as e:
        log.warning("the worker loop ended: Redis failed it (%s)", e)
        return "failed"
    except ValueError as e:
        log.warning("RQ refused to start the worker (%s); starting the next one", e)
        return "refused"
    finally:
        # RQ's handlers outlive work(); between runs a signal simply ends the process.
        signal.signal(signal.SIGTERM, _exit_cleanly)
        signal.signal(signal.SIGINT, _exit_cleanly)
    return None


def close_channel(worker: Worker) -> None:
    """The run's command channel closed, at most once and within a bounded time, whatever
    Redis answers."""
    with contextlib.suppress(RedisError, OSError):
        worker.unsubscribe()


def record_end(worker: Worker) -> bool:
    """A run's end, which RQ's teardown records unless Redis failed that too: its command
    channel closed and its registration gone, so that /health and /metrics count this
    process once (a Redis that kept its data keeps the old registration, alive for minutes
    by its TTL, beside the next run's). False while Redis fails it."""
    close_channel(worker)
    try:
        worker.register_death()
    except RedisError:
        return False
    return True


def exit_at_once() -> None:
    """Ends the process without the interpreter's teardown: freeing the heap of torch and
    its exporters takes seconds, and a stopping host's grace (docker stop: 10 s) is short.
    The worker has nothing left to tidy; its log is flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

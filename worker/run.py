"""One RQ worker process, bound to one GPU (or the CPU) by its environment.

Started by `trainq worker`; the launcher sets CUDA_VISIBLE_DEVICES before this process
starts. torch and the job function's whole import tree are loaded here, before the worker
forks a work horse per job, so each job starts in milliseconds. CUDA itself is first
touched inside the work horse, never here (a CUDA context does not survive fork)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

import torch  # noqa: F401  (imported for fast forks; CUDA stays untouched)
import torchvision  # noqa: F401
from rq import Queue, Worker
from rq.exceptions import InvalidJobOperation
from rq.job import Job
from rq.job_lifecycle import record_job_failure
from rq.serializers import JSONSerializer

import worker.tasks  # the job function and all it imports, ready in each fork
from core.config import Settings
from core.logs import configure_json_logging
from core.queue import FAILURE_TTL_S, TASK, QueueEntry, contract_violation
from core.redis_server import READ_TIMEOUT_S, connect, use_read_timeout

log = logging.getLogger("trainq.worker")


class TrainqJob(Job):
    """A queue entry as a trainq worker holds it: whatever names it carries, it calls
    worker.tasks.train and nothing else, imports no callback and calls no webhook. RQ would
    otherwise import and call a producer's failure callback even while it cleans up an
    abandoned entry, outside any job this worker chose to run."""

    @property
    def func(self) -> Callable[..., Any]:
        if self.func_name != TASK:
            raise InvalidJobOperation(f"only {TASK} runs on a trainq worker")
        return worker.tasks.train

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None

    def send_webhooks(self, status: str, *, exc_string: str | None = None) -> None:
        return None


def queue_entry(job: Job) -> QueueEntry:
    """What the producer stored, read without deserialising or importing any of it (the
    callback properties would import the callbacks; RQ has no public name for them)."""
    names = (job._success_callback_name, job._failure_callback_name, job._stopped_callback_name)
    return QueueEntry(
        id=job.id,
        payload=job.data,
        callbacks=tuple(n for n in names if n),
        webhooks=len(job.webhooks),
        dependencies=tuple(job._dependency_ids),
        retries=job.retries_left or 0,
        repeats=job.repeats_left or 0,
    )


class TrainqWorker(Worker):
    """RQ's forking worker, for trainq's one job function: it runs only entries that keep
    the queue contract (core.queue)."""

    def execute_job(self, job: Job, queue: Queue) -> None:
        reason = contract_violation(queue_entry(job))
        if reason is None:
            super().execute_job(job, queue)
        else:
            self.refuse(job, queue, reason)

    def refuse(self, job: Job, queue: Queue, reason: str) -> None:
        """Fail the entry in RQ (its FailedJobRegistry, with the reason) without forking:
        nothing of it runs and no trainq job row is made."""
        log.error("refused queue entry %s: %s", job.id, reason)
        job.failure_ttl = FAILURE_TTL_S  # not the producer's: it could keep the entry forever
        with self.connection.pipeline() as p:
            record_job_failure(job, f"refused by trainq: {reason}", p)
            p.lrem(queue.intermediate_queue_key, 1, job.id)  # RQ's dequeue parked it there
            p.execute()

    def main_work_horse(self, job: Job, queue: Queue) -> None:
        # RQ raised this connection's read timeout above its blocking dequeue (minutes). The
        # horse never blocks on Redis, so its commands get trainq's own: a partition costs
        # the training loop seconds, not minutes.
        use_read_timeout(self.connection, READ_TIMEOUT_S)
        super().main_work_horse(job, queue)

    def handle_warm_shutdown_request(self) -> None:
        """SIGTERM (docker stop, a spot reclaim, a node drain; SIGKILL follows in about
        10 s): the work horse gets SIGTERM too, so that its job checkpoints at the next step
        and goes back on the queue (worker.tasks), and RQ's warm shutdown waits for that
        instead of for the whole job. Only the horse: its DataLoader workers, in its
        process group, are its to stop."""
        super().handle_warm_shutdown_request()
        if self.horse_pid:
            with contextlib.suppress(ProcessLookupError):  # it has just ended
                os.kill(self.horse_pid, signal.SIGTERM)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True, help="host and GPU; the process id is appended")
    p.add_argument("--queue", required=True)
    p.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    args = p.parse_args()
    # From the environment, not the command line: the URL may hold a password, and every
    # user of the host can read a command line.
    url = Settings().redis_url
    if not url:
        p.error("TRAINQ_REDIS_URL is not set (trainq worker sets it)")
    configure_json_logging(logging.INFO)
    r = connect(url)
    worker = TrainqWorker(
        [args.queue],
        name=f"{args.name}-{os.getpid()}",  # a restarted worker never clashes with its ghost
        connection=r,
        serializer=JSONSerializer,
        job_class=TrainqJob,  # its queue and registries, maintenance included, hold these
        job_monitoring_interval=5,
    )
    worker.work(burst=args.burst, logging_level="INFO", with_scheduler=False)


if __name__ == "__main__":
    main()

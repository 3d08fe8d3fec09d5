"""One RQ worker process, bound to one GPU (or the CPU) by its environment.

Started by `trainq worker`; the launcher sets CUDA_VISIBLE_DEVICES before this process
starts. torch and the job function's whole import tree are loaded here, before the worker
forks a work horse per job, so each job starts in milliseconds. CUDA itself is first
touched inside the work horse, never here (a CUDA context does not survive fork)."""

from __future__ import annotations

import argparse
import logging
import os

import torch  # noqa: F401  (imported for fast forks; CUDA stays untouched)
import torchvision  # noqa: F401
from rq import Worker
from rq.serializers import JSONSerializer

import worker.tasks  # noqa: F401  (the job function and all it imports, ready in each fork)
from core.logs import configure_json_logging
from core.queue import job_queue
from core.redis_server import connect


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True, help="host and GPU; the process id is appended")
    p.add_argument("--queue", required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    args = p.parse_args()
    configure_json_logging(logging.INFO)
    r = connect(args.redis_url)
    worker = Worker(
        [job_queue(r, args.queue)],
        name=f"{args.name}-{os.getpid()}",  # a restarted worker never clashes with its ghost
        connection=r,
        serializer=JSONSerializer,
        job_monitoring_interval=5,
    )
    worker.work(burst=args.burst, logging_level="INFO", with_scheduler=False)


if __name__ == "__main__":
    main()

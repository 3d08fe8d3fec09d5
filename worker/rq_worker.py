"""One RQ worker process, bound to one GPU (or the CPU) by its environment.

Started by `trainq worker`; the launcher sets CUDA_VISIBLE_DEVICES before this process
starts. torch and the job function's whole import tree are loaded here, before the worker
forks a work horse per job, so each job starts in milliseconds. CUDA itself is first
touched inside the work horse, never here (a CUDA context does not survive fork).
See docs/operations.md."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import signal
import time
from typing import Any

import onnxscript  # noqa: F401  (the ONNX exporter's: a second of each job's export)
import torch  # noqa: F401  (imported for fast forks; CUDA stays untouched)
import torchvision  # noqa: F401
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, worker_registration
from rq.command import handle_stop_job_command
from rq.executions import Execution
from rq.job import Job
from rq.job_lifecycle import record_job_failure
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import WorkerStatus
from sqlalchemy.exc import SQLAlchemyError

from core.config import Settings
from core.db import Database
from core.lifetime import ParentGone, end_with_parent
from core.redis_client import READ_TIMEOUT_S, connect, use_read_timeout, wrong_type
from core.train.checker import share
from core.train.export import warm_up
from core.train.kept_data import KEPT
from core.versions import running_versions
from worker import kept
from worker.command_channel import CommandChannel

# worker.entries imports the job function and all it imports: ready in each fork.
from worker.entries import (
    TrainqJob,
    TrainqQueue,
    drop_entry,
    drop_junk_ids,
    drop_wrong_types,
    id_problem,
    queue_entry,
)
from worker.entry_checks import contract_violation
from worker.fair_share import FairShare
from worker.kept import keep_data, need_for, relieve_memory
from worker.logs import configure_json_logging
from worker.work_loop import RETRY_FIRST_S, RETRY_MAX_S, asked_to_stop, exit_at_once, serve

log = logging.getLogger("trainq.worker")

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}  # RQ's warm shutdown
FAIR_POLL_S = 1  # fair share: how often an idle worker looks again at a queue it cannot take from


def _command(data: object) -> dict[str, Any] | None:
    """A stop-job command as trainq sends it (RQ's JSON, a few dozen bytes), or None."""
    if not isinstance(data, bytes) or len(data) > 1024:
        return None
    try:
        payload = json.loads(data)
    except ValueError:  # not JSON, or not UTF-8
        return None
    if not isinstance(payload, dict) or payload.get("command") != "stop-job":
        return None
    return payload if isinstance(payload.get("job_id"), str) else None


class TrainqWorker(CommandChannel):
    """RQ's forking worker, for trainq's one job function: it runs only entries that keep
    the queue contract (core.queue)."""

    def __init__(
        self,
        *args: Any,
        job_timeout_s: int,
        settings: Settings | None = None,
        fair_share_db: Database | None = None,
        **kwargs: Any,
    ) -> None:
        """`fair_share_db`: take jobs by fair share (worker.fair_share), reading the job rows
        there; None: RQ's own dequeue, the queue's head first."""
        super().__init__(*args, **kwargs)
        self.job_timeout_s = job_timeout_s
        self.data_dir = (settings or Settings()).data_dir
        self.fair = (
            None
            if fair_share_db is None
            else FairShare(self.connection, fair_share_db, settings or Settings(), self.queues[0])
        )

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """RQ's dequeue, or with fair share the entry that worker.fair_share chooses, taken
        into RQ's intermediate list as RQ's own dequeue does; from there on RQ's usual path.
        `timeout` None (burst): one look, no wait."""
        if self.fair is None:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        self.set_state(WorkerStatus.IDLE)
        self.procline(f"Listening on {self.queues[0].name} (fair share)")
        idle_since = time.monotonic()
        delay = RETRY_FIRST_S
        while True:
            try:
                self.heartbeat()
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()
                result = self._take_fairly(self.fair)
                if result is not None or timeout is None:
                    break
                if max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                    break
                self.fair.wait(min(timeout, FAIR_POLL_S))
                delay = RETRY_FIRST_S
            except (RedisError, SQLAlchemyError) as e:
                # As RQ's dequeue does for a lost Redis; a refused command (a full Redis
                # refuses the lock's SET and the heartbeat) and the database away too only
                # delay the choice, never end the worker
                log.warning("fair share cannot choose (%s); trying again in %.0f s", e, delay)
                if wrong_type(e):
                    with contextlib.suppress(RedisError):
                        drop_wrong_types(self.connection, self.queues[0].name)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
        self.heartbeat()
        if result is not None:
            log.info("took entry %s by fair share", result[0].id)
        return result

    def _take_fairly(self, fair: FairShare) -> tuple[Job, Queue] | None:
        """The chosen entry as RQ's dequeue returns it, past ids and entries it cannot read
        (dropped as TrainqQueue does), or None when nothing may start now."""
        queue = self.queues[0]
        while True:
            raw = fair.take()
            if raw is None:
                return None
            problem = id_problem(raw)
            if problem is not None:
                self.connection.lrem(queue.intermediate_queue_key, 1, raw)  # type: ignore[arg-type]
                drop_entry(self.connection, raw, problem)
                continue
            fetched = self.queue_class._fetch_dequeued_job(
                self.connection,
                queue.key,
                raw.decode(),
                job_class=self.job_class,
                serializer=self.serializer,
                death_penalty_class=self.death_penalty_class,
            )
            if fetched is not None:
                fetched[0].redis_server_version = self.get_redis_server_version()  # as RQ's
                return fetched

    def handle_payload(self, message: dict[str, Any]) -> None:
        """RQ's command channel takes anyone's message who can write to Redis. Only
        `stop-job` is heard, the one command trainq sends (worker.entry_checks.stop_entry,
        naming the entry this worker runs): `shutdown` and `kill-horse` would stop any job or worker
        without the database knowing why. Nothing here raises: an exception ends RQ's
        command thread for good, and stop-job with it."""
        data = message.get("data")
        try:
            payload = _command(data)
            if payload is None:
                log.warning("ignored a message on the command channel: %.100r", data)
            else:
                handle_stop_job_command(self, payload)
        except Exception:
            log.exception("a command on the command channel failed")

    def run_maintenance_tasks(self) -> None:
        """RQ's registry clean-up (as a worker starts, then every 10 minutes) decodes every
        id in its registries and intermediate list, which a queue writer controls: ids it
        cannot read are dropped first, and any other failure of it is logged, not fatal (the
        launcher would restart the worker into the same junk)."""
        try:
            for queue in self.queues:
                drop_junk_ids(self.connection, queue)
            super().run_maintenance_tasks()
        except (RedisConnectionError, RedisTimeoutError):
            raise  # the worker loop's own handling: Redis is away
        except Exception:  # a refused command too (a full Redis, a key of the wrong type)
            log.exception("RQ's registry maintenance failed; the worker carries on")
            self.last_cleaned_at = now()  # type: ignore[assignment]  # the next try in RQ's interval, not at once
            for queue in self.queues:
                with contextlib.suppress(RedisError):
                    queue.release_maintenance_lock()

    def execute_job(self, job: Job, queue: Queue) -> None:
        reason = contract_violation(queue_entry(job))
        if reason is None:
            _share_checker()  # again if it exited: the horse forked next asks it
            relieve_memory(need_for(job, self.data_dir))  # room for what the horse reads
            job.timeout = self.job_timeout_s  # the worker's own, as the TTLs (TrainqJob.restore)
            kept.TOLD = kept.Told()  # the horse tells which set its admitted job trained on
            try:
                super().execute_job(job, queue)
            finally:
                told, kept.TOLD = kept.TOLD.heard(), None
            if not asked_to_stop(self):  # read here once, for the horses of the next jobs
                with contextlib.suppress(RedisError):  # seen alive through a long read
                    self.heartbeat(self.job_monitoring_interval + 60)
                keep_data(told, self.data_dir)
        else:
            self.refuse(job, queue, reason)

    def refuse(self, job: Job, queue: Queue, reason: str) -> None:
        """Fail the entry in RQ (its FailedJobRegistry, with the reason) without forking:
        nothing of it runs and no trainq job row is made."""
        log.error("refused queue entry %s: %s", job.id, reason)
        with self.connection.pipeline() as p:
            record_job_failure(job, f"refused by trainq: {reason}", p)
            p.lrem(queue.intermediate_queue_key, 1, job.id)  # RQ's dequeue parked it there
            p.execute()

    def serialize(self) -> dict[str, Any]:
        """RQ's registration, and the versions this worker runs (core.versions): the
        admin's /health shows them, and says when they differ from the API's."""
        return {**super().serialize(), **running_versions().fields()}

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat, and the worker's whole registration with it (as register_birth
        writes it): a Redis that restarted empty has lost both the worker's hash and its
        place in the sets of workers, and RQ would only extend a hash that is gone, so the
        worker would never count again in /health or /metrics. Idle or busy (the beats
        while a work horse runs come through here too, from maintain_heartbeats), the
        next beat writes it all back.

        While a work horse runs, a heartbeat Redis refuses (away, or full: OOM) is logged,
        not fatal: a parent that quit would orphan its horse, and the launcher's next worker
        would take a second job onto the same GPU."""
        try:
            if pipeline is not None:
                self._beat(timeout, pipeline)
            else:
                with self.connection.pipeline() as p:
                    self._beat(timeout, p)
                    p.execute()
        except RedisError as e:
            if not self.horse_pid:
                raise
            log.warning("worker heartbeat not sent (%s); the job goes on", e)

    def _beat(self, timeout: int | None, pipeline: Any) -> None:
        if self.birth_date is not None:  # born: register_birth wrote the first one
            pipeline.hset(self.key, mapping={**self.serialize(), "state": self.get_state()})
            worker_registration.register(self, pipeline)
        super().heartbeat(timeout, pipeline)

    def maintain_heartbeats(self, job: Job, execution: Execution) -> None:
        try:
            super().maintain_heartbeats(job, execution)
        except RedisError as e:  # as in heartbeat: the horse goes on, and so does its parent
            log.warning("job heartbeat of %s not sent (%s); the job goes on", job.id, e)
        # After the beat, memory only (no file is read): the horse let go of the sets it
        # does not use (KEPT.use_only), so dropping them here frees them.
        relieve_memory(check_files=False)

    def fork_work_horse(self, job: Job, queue: Queue) -> None:
        """RQ's fork, with SIGTERM and SIGINT held across it. In the worker, one that came
        in between is delivered once the horse's pid is known, so the horse is told
        (handle_warm_shutdown_request). In the horse, SIGTERM stays held until the job
        function's handler is in place (worker.preemption): one that came before it is
        delivered to it, and the job is handed back, where it used to kill the horse."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            stopping = asked_to_stop(self)  # before the horse: no one would tell it
            super().fork_work_horse(job, queue)  # only the worker returns from it
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if stopping:
            self.stop_horse()

    def setup_work_horse_signals(self) -> None:
        """RQ's (SIGINT ignored, SIGTERM default), and SIGINT no longer held: only SIGTERM
        waits for the job function's handler."""
        super().setup_work_horse_signals()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def main_work_horse(self, job: Job, queue: Queue) -> None:
        die_with_parent(self.pid or 0)  # set in the worker: its own pid
        if self.fair is not None:  # the parent's pooled connections stay the parent's
            self.fair.db.engine.dispose(close=False)
        # RQ raised this connection's read timeout above its blocking dequeue (minutes). The
        # horse never blocks on Redis, so its commands get trainq's own: a partition costs
        # the training loop seconds, not minutes.
        use_read_timeout(self.connection, READ_TIMEOUT_S)
        super().main_work_horse(job, queue)

    def handle_warm_shutdown_request(self) -> None:
        """SIGTERM (docker stop, a spot reclaim, a node drain; SIGKILL follows in about
        10 s): the work horse gets SIGTERM too, so that its job checkpoints at the next step
        and goes back on the queue (worker.preemption), and RQ's warm shutdown waits for that
        instead of for the whole job. Only the horse: its DataLoader workers, in its
        process group, are its to stop."""
        super().handle_warm_shutdown_request()
        self.stop_horse()

    def stop_horse(self) -> None:
        if self.horse_pid:
            with contextlib.suppress(ProcessLookupError):  # it has just ended
                os.kill(self.horse_pid, signal.SIGTERM)


def die_with_parent(parent: int) -> None:
    """A work horse gets SIGTERM when its parent dies (kill -9, a crash), so that its job
    checkpoints and goes back on the queue (worker.preemption) instead of training on beside
    the launcher's next worker. The signal is held until the job function's handler is in
    place (fork_work_horse), so it is never fatal before."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        end_with_parent(parent, signal.SIGTERM)
    except OSError as e:
        log.warning("work horse: its parent's death will not be signalled: %s", e)
    except ParentGone:
        log.error("work horse: its worker is gone before the job started")
        os._exit(1)


def _share_checker() -> None:
    """The process that checks each job's formats (core.train.checker), started by this
    worker for all its horses; a horse that finds it gone starts its own."""
    try:
        share()
    except OSError as e:
        log.warning("the formats' checker could not start (%s); each job starts its own", e)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True, help="host and GPU; the process id is appended")
    p.add_argument("--queue", required=True)
    p.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    args = p.parse_args()
    # From the environment, not the command line: the URL may hold a password, and every
    # user of the host can read a command line.
    settings = Settings()
    url = settings.redis_url
    if not url:
        p.error("TRAINQ_REDIS_URL is not set (trainq worker sets it)")
    configure_json_logging(logging.INFO)
    r = connect(url)
    runs = itertools.count()
    fair_share_db = Database.from_settings(settings) if settings.fair_share else None

    def make_worker() -> TrainqWorker:
        # With the process id, a restarted worker never clashes with its ghost; with the
        # run's number, a run never clashes with the last one in this process.
        n = next(runs)
        drop_wrong_types(r, args.queue)
        return TrainqWorker(
            [args.queue],
            name=f"{args.name}-{os.getpid()}" + (f"-{n}" if n else ""),
            connection=r,
            serializer=JSONSerializer,
            job_class=TrainqJob,  # its queue and registries, maintenance included, hold these
            queue_class=TrainqQueue,
            job_monitoring_interval=5,
            job_timeout_s=settings.job_timeout_s,
            settings=settings,
            fair_share_db=fair_share_db,
        )

    _share_checker()
    KEPT.max_bytes = settings.dataset_keep_mb << 20
    warm_up()  # the exports' first-call costs, paid once here and not by every job
    serve(make_worker, r, burst=args.burst)
    exit_at_once()


if __name__ == "__main__":
    main()

"""The RQ job function. Its import path, `worker.tasks.train`, is part of the queue contract
(core.queue): keep it stable."""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from redis import Redis
from redis.exceptions import RedisError
from rq import get_current_job

from core.config import Settings
from core.db import Database, JobStatus, UserDataset
from core.errors import (
    DatasetNotFound,
    InvalidSpec,
    JobSuperseded,
    TrainingStopped,
    TrainqError,
)
from core.logs import current_job
from core.spec import JobSpec, user_dataset_id
from core.store import (
    claim_job,
    create_job,
    dataset_data,
    end_job,
    get_job,
    heartbeat,
    latest_checkpoint,
    save_epoch,
    save_steps,
    set_total_steps,
    succeed_job,
)
from core.stream import cancel_key, publish_epoch, publish_status, publish_steps
from core.train import Callbacks, EpochMetrics, StepMetrics
from core.train import train as run_training
from core.train.data import user_dataset_path
from core.train.loop import RunInfo
from core.worker_stats import publish_worker_stats

log = logging.getLogger("trainq.worker")
CANCEL_POLL_S = 0.25


def train(spec: Any, owner: str | None = None, job_id: str | None = None) -> dict[str, Any]:
    """Run one training job: validate, claim, train (resuming from the last checkpoint),
    store the results. Every outcome ends in the job row; nothing is retried by RQ.

    `job_id` is given only when the queue entry's id is not the job's own (a requeue)."""
    rq_job = get_current_job()
    if rq_job is None:
        raise RuntimeError("worker.tasks.train runs inside an RQ worker")
    settings = Settings()
    db = Database.from_settings(settings)
    current_job.set(job_id or rq_job.id)
    try:
        return _run(
            job_id or rq_job.id,
            rq_job.id,
            spec,
            owner,
            settings,
            db,
            rq_job.connection,
            rq_job.worker_name or "?",
        )
    finally:
        db.dispose()


def _run(
    job_id: str,
    queue_entry: str,
    raw_spec: Any,
    owner: str | None,
    settings: Settings,
    db: Database,
    r: Redis,
    worker_name: str,
) -> dict[str, Any]:
    try:
        uuid.UUID(job_id)
    except ValueError:
        log.error("refusing job %r: trainq job ids are UUIDs", job_id)
        return {"status": JobStatus.failed, "error": "invalid job id"}
    spec, problem = _validate(raw_spec)
    with db.session() as s:
        if get_job(s, job_id=job_id) is None:  # submitted straight to the queue
            create_job(
                s,
                job_id=job_id,
                spec=spec or {"as_sent": raw_spec},
                owner=owner,
                queue_entry=queue_entry,
            )
    if spec is None:
        return _fail(db, r, job_id, None, 0, InvalidSpec("spec", problem or "invalid"))

    from core.train.device import device_name, resolve_device

    device = device_name(resolve_device("auto"))
    with db.session() as s:
        job = claim_job(s, job_id=job_id, worker=worker_name, device=device)
        checkpoint = latest_checkpoint(s, job_id=job_id) if job else None
        resume = (checkpoint.data, checkpoint.step) if checkpoint else None
    if job is None:
        log.info("job %s is not queued (ended, or running elsewhere); not running it", job_id)
        return {"status": "skipped"}
    start_step = resume[1] if resume else 0
    sink = _Sink(job_id, job.attempt, worker_name, spec.batch_size, db, r, settings)
    sink.status(
        start_step,
        {
            "status": JobStatus.running,
            "attempt": job.attempt,
            "worker": worker_name,
            "device": device,
            "resumed_from_step": start_step,
        },
    )
    try:
        place_dataset(db, settings.data_dir, spec.dataset)
        result = run_training(
            spec,
            data_dir=settings.data_dir,
            callbacks=sink.callbacks(),
            resume=resume[0] if resume else None,
        )
    except JobSuperseded as e:
        log.warning("job %s: %s; stopping this attempt", job_id, e.message)
        return {"status": "superseded"}
    except TrainqError as e:
        sink.flush_history()
        return _fail(db, r, job_id, job.attempt, sink.last_step or start_step, e)
    summary = result.summary()
    with db.session() as s:
        ok = succeed_job(
            s,
            job_id=job_id,
            attempt=job.attempt,
            result=summary,
            record=result.record,
            model=result.model,
            sha256=result.model_sha256,
        )
    status = JobStatus.succeeded if ok else _status_of(db, job_id)
    sink.status(result.steps, {"status": status, "result": summary})
    return {"status": status, **summary}


def place_dataset(db: Database, data_dir: Path, name: str) -> None:
    """An uploaded data set ("ds:<id>") goes from the database to the file the trainer reads
    (core.train.data.user_dataset_path), once per worker host: written atomically, and
    rewritten if a file is there but is not the stored one."""
    ds_id = user_dataset_id(name)
    if ds_id is None:
        return
    path = user_dataset_path(name, data_dir)
    with db.session() as s:
        if path.exists():
            row = s.get(UserDataset, ds_id)
            if row is not None and _sha256(path) == row.sha256:
                return
        found = dataset_data(s, dataset_id=ds_id)
    if found is None:
        raise DatasetNotFound(f"data set {name!r} does not exist (it was never uploaded)")
    sha256, blob = found
    if hashlib.sha256(blob).hexdigest() != sha256:
        raise DatasetNotFound(f"data set {name!r}: the stored copy failed its sha256 check")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # workers sharing a data folder may race
    tmp.write_bytes(blob)
    os.replace(tmp, path)  # atomic: the trainer never sees half a file


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _validate(raw: Any) -> tuple[JobSpec | None, str | None]:
    try:
        return JobSpec.model_validate(raw), None
    except ValidationError as e:
        parts = [
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}" for err in e.errors()
        ]
        return None, "; ".join(parts)


def _fail(
    db: Database, r: Redis, job_id: str, attempt: int | None, step: int, e: TrainqError
) -> dict[str, Any]:
    status = JobStatus.canceled if isinstance(e, TrainingStopped) else JobStatus.failed
    with db.session() as s:
        end_job(s, job_id=job_id, status=status, code=e.code, message=e.message, attempt=attempt)
    final = _status_of(db, job_id)
    error = {"code": e.code, "message": e.message}
    try:
        publish_status(r, job_id, step, {"status": final, "error": error})
    except RedisError as re:
        log.warning("job %s: could not publish its end: %s", job_id, re)
    log.info("job %s ended %s: %s", job_id, final, e.message)
    return {"status": final, "error": error}


def _status_of(db: Database, job_id: str) -> JobStatus:
    with db.session() as s:
        job = get_job(s, job_id=job_id)
        return JobStatus(job.status) if job else JobStatus.failed


class _Sink:
    """Trainer callbacks -> Redis (every block of steps, one round trip) and the DB (once per
    epoch: that epoch's steps, its metrics and its checkpoint in one transaction; and a
    heartbeat every few seconds, written from the training loop itself).

    Redis is best effort here: while it is away, points wait in memory and go out when it
    is back; the database keeps the full history either way."""

    def __init__(
        self,
        job_id: str,
        attempt: int,
        worker: str,
        batch_size: int,
        db: Database,
        r: Redis,
        settings: Settings,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.worker = worker
        self.batch_size = batch_size
        self.cancel_requested = False
        self.db = db
        self.r = r
        self.maxlen = settings.metrics_maxlen
        self.heartbeat_every = min(5.0, settings.heartbeat_timeout_s / 3)
        self.unsaved: list[StepMetrics] = []
        self.unpublished: list[StepMetrics] = []
        self.last_step = 0
        self.pending_epoch: EpochMetrics | None = None
        self.next_cancel_check = 0.0
        self.next_heartbeat = time.monotonic() + self.heartbeat_every

    def callbacks(self) -> Callbacks:
        return Callbacks(
            on_start=self.on_start,
            on_steps=self.on_steps,
            on_epoch=self.on_epoch,
            on_checkpoint=self.on_checkpoint,
            should_stop=self.should_stop,
        )

    def status(self, step: int, payload: dict[str, Any]) -> None:
        try:
            publish_status(self.r, self.job_id, step, payload)
        except RedisError as e:
            log.warning("job %s: could not publish status %s: %s", self.job_id, payload, e)

    def on_start(self, info: RunInfo) -> None:
        with self.db.session() as s:
            set_total_steps(
                s, job_id=self.job_id, attempt=self.attempt, total_steps=info.total_steps
            )

    def on_steps(self, points: Sequence[StepMetrics]) -> None:
        self.unsaved.extend(points)
        self.unpublished.extend(points)
        self.last_step = points[-1].step
        try:
            publish_steps(self.r, self.job_id, self.unpublished, self.maxlen)
            self.unpublished = []
            last = points[-1]
            publish_worker_stats(
                self.r,
                self.worker,
                {
                    "job_id": self.job_id,
                    "images_per_second": last.images_per_second,
                    "step_seconds": self.batch_size / max(last.images_per_second, 1e-9),
                    "memory_allocated": last.memory_allocated,
                    "memory_reserved": last.memory_reserved,
                    "memory_peak": last.memory_peak,
                },
            )
        except RedisError as e:
            log.warning("job %s: Redis unavailable (%s); %d steps wait", self.job_id, e,
                        len(self.unpublished))  # fmt: skip
        if time.monotonic() >= self.next_heartbeat:
            with self.db.session() as s:
                self.cancel_requested = heartbeat(s, job_id=self.job_id, attempt=self.attempt)
            self.next_heartbeat = time.monotonic() + self.heartbeat_every

    def on_epoch(self, m: EpochMetrics) -> None:
        self.pending_epoch = m  # stored with its checkpoint, which comes next

    def on_checkpoint(self, epoch: int, blob: bytes) -> None:
        m = self.pending_epoch
        if m is None or m.epoch != epoch:
            raise RuntimeError("checkpoint without its epoch metrics")
        steps = [p for p in self.unsaved if p.step <= m.step]
        with self.db.session() as s:
            save_epoch(
                s, job_id=self.job_id, attempt=self.attempt, epoch=m, steps=steps, checkpoint=blob
            )
        self.unsaved = [p for p in self.unsaved if p.step > m.step]
        self.next_heartbeat = time.monotonic() + self.heartbeat_every
        if not self.unpublished:  # keep the stream in step order
            try:
                publish_epoch(self.r, self.job_id, m)
            except RedisError as e:
                log.warning("job %s: could not publish epoch %d: %s", self.job_id, epoch, e)

    def flush_history(self) -> None:
        """A run that stops mid-epoch keeps the steps it made."""
        try:
            with self.db.session() as s:
                save_steps(s, job_id=self.job_id, attempt=self.attempt, steps=self.unsaved)
        except JobSuperseded:
            return
        self.unsaved = []
        if self.unpublished:
            try:
                publish_steps(self.r, self.job_id, self.unpublished, self.maxlen)
                self.unpublished = []
            except RedisError:
                pass  # the database has them

    def should_stop(self) -> bool:
        if self.cancel_requested:
            return True
        now = time.monotonic()
        if now < self.next_cancel_check:
            return False
        self.next_cancel_check = now + CANCEL_POLL_S
        try:
            return bool(self.r.exists(cancel_key(self.job_id)))
        except RedisError:
            return False

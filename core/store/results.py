"""What a job's attempts leave: per-step and per-epoch metrics, the checkpoint it resumes
from, the model, and the two ends of an attempt that carry them (a preemption's hand-back,
a success). An attempt that no longer owns its job writes nothing. See docs/jobs.md."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy import bindparam, delete, insert, select
from sqlalchemy.orm import Session

from core.db import Artifact, Checkpoint, EpochMetric, Job, StepMetric, allow_time_for
from core.spec import (
    BEFORE_FIELD,
    BUILT_IN_IMAGES,
    JobSpec,
    JobStatus,
    stored_spec,
    user_dataset_id,
)
from core.store.jobs import fence
from core.store.lifecycle import move, requeued

if TYPE_CHECKING:
    from core.train import EpochMetrics, StepMetrics
    from core.train.metrics import ExportedModel


def save_epoch(
    s: Session,
    *,
    job_id: str,
    attempt: int,
    epoch: EpochMetrics,
    steps: Sequence[StepMetrics],
    checkpoint: bytes | None,
) -> None:
    """One transaction per epoch: its step history, its metrics and its checkpoint. A re-run
    of an epoch (after a resume) replaces what an earlier attempt wrote, never duplicates."""
    fence(s, job_id, attempt, progress_step=epoch.step, progress_epoch=epoch.epoch)
    _replace_steps(s, job_id, steps[0].step if steps else epoch.step + 1, steps)
    s.execute(
        delete(EpochMetric).where(EpochMetric.job_id == job_id, EpochMetric.epoch >= epoch.epoch)
    )
    s.add(EpochMetric(job_id=job_id, **asdict(epoch)))
    if checkpoint is not None:
        _replace_checkpoint(s, job_id, epoch.epoch, epoch.step, checkpoint)
    s.flush()
    # A big checkpoint on a slow disk may take longer than the heartbeat timeout, while the
    # heartbeat thread waits for the lock this transaction holds: beat again at the end, so
    # that a reconciler waiting on the lock finds the attempt alive.
    fence(s, job_id, attempt)


def save_steps(s: Session, *, job_id: str, attempt: int, steps: Sequence[StepMetrics]) -> None:
    """Steps after the last epoch boundary (a stop mid-epoch): kept for the history."""
    if not steps:
        return
    fence(s, job_id, attempt, progress_step=steps[-1].step)
    _replace_steps(s, job_id, steps[0].step, steps)


def preempt_job(
    s: Session,
    *,
    job_id: str,
    attempt: int,
    epoch: int,
    step: int,
    steps: Sequence[StepMetrics],
    checkpoint: bytes,
    queue_entry: str,
) -> bool:
    """A running attempt whose worker is stopping hands its job back: running -> queued, in
    one transaction with its mid-epoch checkpoint and its steps since the last epoch. It is
    a preemption, not a restart. False if the attempt no longer owns the job."""
    back = requeued(queue_entry, preempted=True)
    if not move(s, job_id, JobStatus.queued, attempt=attempt, progress_step=step, **back):
        return False
    _replace_steps(s, job_id, steps[0].step if steps else step + 1, steps)
    _replace_checkpoint(s, job_id, epoch, step, checkpoint)
    return True


def succeed_job(
    s: Session,
    *,
    job_id: str,
    attempt: int,
    result: dict[str, Any],
    record: dict[str, Any],
    models: Sequence[ExportedModel],
    weights: bytes = b"",
) -> bool:
    """running -> succeeded with its result (its figures copied to the row's final_*
    columns, what GET /jobs sorts by), run record and its model in each verified format,
    and its weights (what init_from starts from); the checkpoint goes (lifecycle.move).
    False if the attempt no longer owns the job."""
    if not move(
        s, job_id, JobStatus.succeeded, attempt=attempt,
        result=result, record=record, error_code=None, error_message=None,
        **final_figures(job_id, result),
    ):  # fmt: skip
        return False
    s.execute(delete(Artifact).where(Artifact.job_id == job_id))
    allow_time_for(s, sum(len(m.data) for m in models) + len(weights))
    s.add_all(
        Artifact(job_id=job_id, format=m.format, data=m.data, sha256=m.sha256, size=len(m.data))
        for m in models
    )
    if weights:
        digest, size = hashlib.sha256(weights).hexdigest(), len(weights)
        s.add(Artifact(job_id=job_id, format=WEIGHTS, data=weights, sha256=digest, size=size))
    return True


def final_figures(job_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """The row's final_* columns of a job that succeeded with `result` (core.train's
    TrainResult.summary: its last epoch's test and train figures); the train accuracy, which
    the result leaves out, is read from the last epoch stored, in the same UPDATE."""
    last_epoch = (
        select(EpochMetric.train_accuracy)
        .where(EpochMetric.job_id == job_id)
        .order_by(EpochMetric.epoch.desc())
        .limit(1)
        .scalar_subquery()
    )
    figures = {f"final_{k}": _number(result.get(k)) for k in FROM_RESULT}
    return {**figures, "final_train_accuracy": last_epoch}


FROM_RESULT = ("test_accuracy", "test_loss", "train_loss", "images_per_second", "duration_s")


def _number(value: Any) -> float | None:
    """A finite figure, or None (an index orders no NaN the same on both databases)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


# Not a model format that is offered for download: the trained weights as a state_dict,
# read back with torch.load(weights_only=True), which a job's init_from starts from.
WEIGHTS = "state_dict"


@dataclass(frozen=True)
class StartWeights:
    model: str  # the architecture that made them
    data: bytes


def start_weights(s: Session, *, job_id: str, owner: str | None) -> StartWeights | None:
    """The trained weights of `owner`'s own succeeded job `job_id`, or None: another owner's
    job is answered exactly as a missing one."""
    job = _startable(s, job_id, owner)
    art = None if job is None else s.get(Artifact, (job_id, WEIGHTS))
    if job is None or art is None:
        return None
    return StartWeights(str(job.spec.get("model", "cnn")), art.data)


@dataclass(frozen=True)
class StartSource:
    """What the weights of a job that init_from names were trained for: its spec, and its
    images' (C, H, W) where known."""

    spec: JobSpec
    image_shape: tuple[int, int, int] | None


def start_source(s: Session, *, job_id: str, owner: str | None) -> StartSource | None:
    """What `owner`'s own succeeded job `job_id` trained its weights for, or None as
    start_weights answers None; the weights themselves are not read."""
    job = _startable(s, job_id, owner)
    stored = select(Artifact.size).where(Artifact.job_id == job_id, Artifact.format == WEIGHTS)
    if job is None or s.scalar(stored) is None:
        return None
    try:
        spec = stored_spec(job.spec)
    except ValidationError:  # a data set no longer offered: its other fields still read
        spec = JobSpec.model_construct(**{**BEFORE_FIELD, **job.spec})
    return StartSource(spec, _trained_shape(spec, job.record))


def _startable(s: Session, job_id: str, owner: str | None) -> Job | None:
    job = s.get(Job, job_id)
    if job is None or job.owner != owner or job.status != JobStatus.succeeded:
        return None
    return job


def _trained_shape(spec: JobSpec, record: dict[str, Any] | None) -> tuple[int, int, int] | None:
    """The shape the run record wrote; a built-in set's for a record without one."""
    shape = ((record or {}).get("dataset") or {}).get("image_shape")
    if isinstance(shape, list) and len(shape) == 3 and all(isinstance(n, int) for n in shape):
        c, h, w = shape
        return c, h, w
    return BUILT_IN_IMAGES[0] if user_dataset_id(spec.dataset) is None else None


def _replace_steps(s: Session, job_id: str, first: int, steps: Sequence[StepMetrics]) -> None:
    """Steps from `first` on are replaced (an attempt re-running them), never duplicated."""
    s.execute(delete(StepMetric).where(StepMetric.job_id == job_id, StepMetric.step >= first))
    if not steps:
        return
    if s.get_bind().dialect.driver == "psycopg":
        _copy_steps(s, job_id, steps)
    else:
        s.execute(insert(StepMetric), [{"job_id": job_id, **asdict(p)} for p in steps])


STEP_COLUMNS = [c.key for c in StepMetric.__table__.columns if c.key != "job_id"]


def _copy_steps(s: Session, job_id: str, steps: Sequence[StepMetrics]) -> None:
    """An epoch's steps in one COPY, inside the session's transaction: on PostgreSQL the
    epoch's write is the largest each worker makes, and its rows through an INSERT took
    most of it (bench.scale measures both)."""
    raw: Any = s.connection().connection.dbapi_connection
    columns = ", ".join(["job_id", *STEP_COLUMNS])
    with raw.cursor() as cur, cur.copy(f"COPY step_metrics ({columns}) FROM STDIN") as copy:
        for p in steps:
            copy.write_row((job_id, *(getattr(p, c) for c in STEP_COLUMNS)))


def _replace_checkpoint(s: Session, job_id: str, epoch: int, step: int, data: bytes) -> None:
    """A job keeps one checkpoint: its latest."""
    s.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id))
    allow_time_for(s, len(data))
    s.add(Checkpoint(job_id=job_id, epoch=epoch, step=step, data=data))


def latest_checkpoint(s: Session, *, job_id: str) -> Checkpoint | None:
    return s.get(Checkpoint, job_id)


def epoch_metrics(s: Session, *, job_id: str) -> Sequence[EpochMetric]:
    return s.scalars(
        select(EpochMetric).where(EpochMetric.job_id == job_id).order_by(EpochMetric.epoch)
    ).all()


def epoch_of(s: Session, *, job_id: str, epoch: int | None) -> EpochMetric | None:
    """A job's epoch `epoch`, or its last epoch when None; None if it has no such epoch."""
    query = select(EpochMetric).where(EpochMetric.job_id == job_id)
    if epoch is not None:
        query = query.where(EpochMetric.epoch == epoch)
    return s.scalars(query.order_by(EpochMetric.epoch.desc()).limit(1)).first()


# Built once: executed on the session's connection, the most polled read (GET
# /jobs/{id}/metrics, the SSE catch-up) skips the ORM and most of the statement compilation.
_STEP_ROWS = (
    select(*[c for c in StepMetric.__table__.columns if c.key != "job_id"])
    .where(StepMetric.job_id == bindparam("job_id"), StepMetric.step > bindparam("after"))
    .order_by(StepMetric.step)
    .limit(bindparam("limit"))
)


def step_rows(s: Session, *, job_id: str, after: int, limit: int) -> list[dict[str, Any]]:
    """step_metrics as plain dicts (for pages served as they are: no ORM objects)."""
    rows = s.connection().execute(_STEP_ROWS, {"job_id": job_id, "after": after, "limit": limit})
    return [dict(row._mapping) for row in rows]


def step_metrics(s: Session, *, job_id: str, after: int, limit: int) -> Sequence[StepMetric]:
    return s.scalars(
        select(StepMetric)
        .where(StepMetric.job_id == job_id, StepMetric.step > after)
        .order_by(StepMetric.step)
        .limit(limit)
    ).all()


def get_artifact(s: Session, *, job_id: str, format: str) -> Artifact | None:
    return s.get(Artifact, (job_id, format))


def artifact_sha256s(s: Session, *, job_id: str) -> dict[str, str]:
    """The sha256 of a job's model per stored format, without reading their bytes."""
    rows = s.execute(select(Artifact.format, Artifact.sha256).where(Artifact.job_id == job_id))
    return {fmt: sha for fmt, sha in rows}

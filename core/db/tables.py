"""The tables: SQLAlchemy models of jobs, sweeps, results, artifacts, data sets and quotas,
the source of truth for all of them. The schema changes only through the Alembic
migrations in `migrations/`. See docs/jobs.md."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from core.db.clock import db_now, utcnow
from core.spec import JobStatus

# A job's final figures, copied onto its row as it succeeds (core.store.results.succeed_job):
# what GET /jobs sorts by, each with an index of its own.
FINAL_COLUMNS = (
    "final_test_accuracy",
    "final_test_loss",
    "final_train_accuracy",
    "final_train_loss",
    "final_images_per_second",
    "final_duration_s",
)
# PostgreSQL compares text by the database's collation, under which a prefix's range is not
# the strings that start with it; byte order (SQLite's own) makes it so.
SearchText = String(128).with_variant(String(128, collation="C"), "postgresql")


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        dt.datetime: DateTime(timezone=True),
    }


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
        Index("ix_jobs_created", "created_at", "id"),
        Index("ix_jobs_status", "status"),
        # GET /jobs (core.store.search): each filter's own jobs of one owner, newest first.
        Index("ix_jobs_owner_created", "owner", "created_at", "id"),
        Index("ix_jobs_owner_status_created", "owner", "status", "created_at", "id"),
        Index("ix_jobs_owner_dataset_created", "owner", "dataset", "created_at", "id"),
        Index("ix_jobs_owner_model_created", "owner", "model", "created_at", "id"),
        Index("ix_jobs_owner_name", "owner", "name_key"),
        # ... and by each final figure: only jobs that have one (they succeeded).
        *(
            Index(
                f"ix_jobs_owner_{column}",
                "owner",
                column,
                "id",
                sqlite_where=text(f"{column} IS NOT NULL"),
                postgresql_where=text(f"{column} IS NOT NULL"),
            )
            for column in FINAL_COLUMNS
        ),
        Index("uq_jobs_sweep_trial", "sweep_id", "trial_number", unique=True),
        # The retention pass's (core.retention.expired): ended, not purged, oldest first.
        Index(
            "ix_jobs_unpurged_finished",
            "finished_at",
            sqlite_where=text("purged_at IS NULL"),
            postgresql_where=text("purged_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.queued)
    spec: Mapped[dict[str, Any]]
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    heartbeat_at: Mapped[dt.datetime | None]
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Attempts that a stopping worker handed back (SIGTERM): not restarts (worker.reconciler).
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    # The attempt whose worker was asked to stop (SIGTERM), written as the request arrives:
    # should it die before it hands the job back, that loss is a preemption too.
    stop_requested_attempt: Mapped[int | None]
    worker: Mapped[str | None] = mapped_column(String(200))
    device: Mapped[str | None] = mapped_column(String(200))
    total_steps: Mapped[int | None]
    progress_step: Mapped[int] = mapped_column(Integer, default=0)  # last step stored in DB
    progress_epoch: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    queue_entry: Mapped[str | None] = mapped_column(String(80))  # the RQ job id that carries it
    # core.spec.SPEC_VERSION of the code that wrote the row's spec (None: before 0012)
    spec_version: Mapped[str | None] = mapped_column(String(12))
    # core.spec.Priority.rank of the spec's priority: orders an owner's own queued jobs.
    priority: Mapped[int] = mapped_column(Integer, default=0)
    # When the retention policy (or `trainq gc`) removed this ended job's step rows,
    # checkpoint and artifacts; the row and its epochs stay.
    purged_at: Mapped[dt.datetime | None]
    enqueued_at: Mapped[dt.datetime | None] = mapped_column(default=db_now())
    result: Mapped[dict[str, Any] | None]
    record: Mapped[dict[str, Any] | None]
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    # A sweep's trial (core.sweeps): its sweep, its number there, the values the search
    # chose (also in `spec`), and what the sampler and pruner keep on it (Optuna's
    # system attributes).
    sweep_id: Mapped[str | None] = mapped_column(String(36))
    trial_number: Mapped[int | None]
    trial_params: Mapped[dict[str, Any] | None]
    trial_attrs: Mapped[dict[str, Any] | None]
    # What people call it (core.labels), beside the spec and no part of its hash. `tags` is
    # what the job shows; job_tags holds the same, one row a tag, for the search.
    name: Mapped[str | None] = mapped_column(String(128))
    name_key: Mapped[str | None] = mapped_column(SearchText)  # core.labels.name_key
    notes: Mapped[str | None] = mapped_column(Text)
    tags: Mapped[list[str] | None] = mapped_column(JSON)
    # The spec's data set and architecture, copied out of it for the search.
    dataset: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(32))
    final_test_accuracy: Mapped[float | None] = mapped_column(Float)
    final_test_loss: Mapped[float | None] = mapped_column(Float)
    final_train_accuracy: Mapped[float | None] = mapped_column(Float)
    final_train_loss: Mapped[float | None] = mapped_column(Float)
    final_images_per_second: Mapped[float | None] = mapped_column(Float)
    final_duration_s: Mapped[float | None] = mapped_column(Float)


class JobTag(Base):
    """One tag of a job (core.store.labels writes them with jobs.tags): the search's index.
    Its owner and creation time are the job's, so that one owner's jobs with a tag are read
    newest first from this index alone."""

    __tablename__ = "job_tags"
    __table_args__ = (
        Index("ix_job_tags_tag_owner_created", "tag", "owner", "created_at", "job_id"),
    )

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime]


class Sweep(Base):
    """A search over job specs (core.sweeps): its trials are jobs naming it."""

    __tablename__ = "sweeps"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_sweeps_owner_idempotency_key"),
        Index("ix_sweeps_owner_created", "owner", "created_at"),
        Index("ix_sweeps_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    # Whose quotas its trials count against when the search queues them: the creator's
    # owner, or None for an admin's (api.auth.Caller.quota_owner).
    quota_owner: Mapped[str | None] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]]  # core.sweeps.spec.SweepSpec, as submitted
    status: Mapped[str] = mapped_column(String(16))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    trials_created: Mapped[int] = mapped_column(Integer, default=0)
    # Why the last top-up queued fewer trials than it wanted (a quota), or None.
    waiting: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None]
    name: Mapped[str | None] = mapped_column(String(128))  # core.labels, as on a job
    notes: Mapped[str | None] = mapped_column(Text)
    tags: Mapped[list[str] | None] = mapped_column(JSON)


class DeletedJob(Base):
    """A job deleted with DELETE /jobs/{id}: a worker that took one of its queue entries just
    before the delete refuses it rather than make the job again from the entry. Kept
    DELETED_JOB_DAYS (core.store.deletion), far past any such race."""

    __tablename__ = "deleted_jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    deleted_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class AttemptTime(Base):
    """One attempt's time on a worker, as max_train_hours_per_day and fair share count it
    (core.quotas): started in the transaction that claims the job, ended in the one that
    moves the job off running (ended, requeued, handed back). No key to the job: the time
    outlives the job's row (a DELETE, the retention policy), so that deleting a job gives
    back none of its hours. Rows that ended past the quota's day go (core.retention)."""

    __tablename__ = "attempt_times"
    __table_args__ = (
        Index("ix_attempt_times_owner_ended", "owner", "ended_at"),
        Index("ix_attempt_times_job_ended", "job_id", "ended_at"),
        Index("ix_attempt_times_ended", "ended_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(36))
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[dt.datetime]
    ended_at: Mapped[dt.datetime | None]  # None while the attempt runs


class Quota(Base):
    """One owner's limits where they differ from the defaults in Settings (core.quotas).
    `limits` holds only the limits overridden; null in it means no limit."""

    __tablename__ = "quotas"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    limits: Mapped[dict[str, Any]]
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class EpochMetric(Base):
    __tablename__ = "epoch_metrics"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int]
    train_loss: Mapped[float] = mapped_column(Float)
    train_accuracy: Mapped[float] = mapped_column(Float)
    test_loss: Mapped[float] = mapped_column(Float)
    test_accuracy: Mapped[float] = mapped_column(Float)
    duration_s: Mapped[float] = mapped_column(Float)
    images_per_second: Mapped[float] = mapped_column(Float)
    # core.train.class_metrics: the confusion matrix and per-class figures on the test split
    class_metrics: Mapped[dict[str, Any] | None]


class StepMetric(Base):
    """Per-batch history, written once per epoch (with that epoch's checkpoint), so that it
    outlives the bounded Redis stream. Its columns are core.train's StepMetrics, written out
    so that the database imports no torch (tests/unit/test_step_record.py keeps them equal)."""

    __tablename__ = "step_metrics"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int]
    loss: Mapped[float] = mapped_column(Float)
    lr: Mapped[float] = mapped_column(Float)
    images_per_second: Mapped[float] = mapped_column(Float)
    memory_allocated: Mapped[int] = mapped_column(BigInteger)
    memory_reserved: Mapped[int] = mapped_column(BigInteger)
    memory_peak: Mapped[int] = mapped_column(BigInteger)
    time: Mapped[float] = mapped_column(Float)


class Checkpoint(Base):
    """The latest checkpoint of a job: what a requeued job resumes from. Written at the end
    of each epoch, and mid-epoch (at `step`, inside `epoch`) when its worker stopped."""

    __tablename__ = "checkpoints"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    epoch: Mapped[int]
    step: Mapped[int]
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Artifact(Base):
    """One format of a job's model (core.spec.ExportFormat), verified when it was stored."""

    __tablename__ = "artifacts"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    format: Mapped[str] = mapped_column(String(32), primary_key=True)
    # Read only when used (a download's body, predict's load): HEAD, 304 and listings never
    # hold a model in memory.
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class UserDataset(Base):
    """A data set uploaded with POST /datasets, in its canonical .npz form (core.datasets).
    Immutable once stored. `data` is loaded only when read (the worker's copy)."""

    __tablename__ = "datasets"
    __table_args__ = (Index("ix_datasets_owner_created", "owner", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    image_shape: Mapped[list[int]] = mapped_column(JSON)  # [C, H, W]
    num_classes: Mapped[int] = mapped_column(Integer)
    train_count: Mapped[int] = mapped_column(Integer)
    test_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    # Since 0013 (NULL in older rows): what the upload was made of and how.
    classes: Mapped[list[str] | None] = mapped_column(JSON)
    class_counts: Mapped[dict[str, list[int]] | None] = mapped_column(JSON)
    holdout_count: Mapped[int | None] = mapped_column(Integer)
    mean: Mapped[list[float] | None] = mapped_column(JSON)
    std: Mapped[list[float] | None] = mapped_column(JSON)
    preprocessing: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    skipped: Mapped[list[dict[str, str]] | None] = mapped_column(JSON)
    thumbnails: Mapped[list[list[str]] | None] = mapped_column(JSON, deferred=True)

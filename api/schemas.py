"""The HTTP contract's response models (documented in OpenAPI at /docs). See docs/api.md."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, Field

from core.labels import LABEL_FIELDS, Labels, Name, Notes, Tags
from core.quotas import Limits, Usage
from core.spec import ExportFormat, JobSpec, JobStatus
from core.sweeps.spec import SweepSpec


class JobRequest(JobSpec):
    """POST /jobs's body: a JobSpec and, beside it, the job's name, tags and notes (core.labels:
    no part of the spec, nor of its hash). Every other field is the spec's, and unknown ones
    are refused."""

    name: Name = None
    tags: Tags = ()
    notes: Notes = None

    def spec(self) -> JobSpec:
        """The spec alone, as validated (no second validation)."""
        fields = {k: getattr(self, k) for k in JobSpec.model_fields}
        return JobSpec.model_construct(self.model_fields_set - set(LABEL_FIELDS), **fields)

    def labels(self) -> Labels:
        return Labels.model_construct(name=self.name, tags=self.tags, notes=self.notes)


class SweepRequest(SweepSpec):
    """POST /sweeps's body: a SweepSpec and the sweep's name, tags and notes (core.labels).
    Each trial starts with the sweep's tags, and is named after it ("<name> #<trial>")."""

    name: Name = None
    tags: Tags = ()
    notes: Notes = None

    def spec(self) -> SweepSpec:
        fields = {k: getattr(self, k) for k in SweepSpec.model_fields}
        return SweepSpec.model_construct(self.model_fields_set - set(LABEL_FIELDS), **fields)

    def labels(self) -> Labels:
        return Labels.model_construct(name=self.name, tags=self.tags, notes=self.notes)


# The database's step columns are 32-bit integers: no cursor past this names a step.


class Progress(BaseModel):
    step: int = Field(description="Last training step reported.")
    total_steps: int | None = Field(description="Steps the whole run will take, once known.")
    epoch: int = Field(description="Last completed epoch.")


class JobError(BaseModel):
    code: str = Field(description="Stable error code, e.g. invalid_spec, diverged, timeout.")
    message: str


class JobResult(BaseModel):
    test_accuracy: float
    test_loss: float
    train_loss: float
    images_per_second: float = Field(description="Training steps only.")
    duration_s: float
    epochs: int
    steps: int
    stopped_early: str | None = None


class TrialOf(BaseModel):
    id: str = Field(description="The sweep's id.")
    trial: int = Field(description="The trial's number in its sweep, from 0.")
    params: dict[str, Any] = Field(description="The values the search chose for it.")
    link: str


class Links(BaseModel):
    self: str
    metrics: str
    epochs: str
    events: str
    model: str = Field(
        description="The model in the job's `default_format` (add ?format= for another)."
    )
    models: dict[str, str] = Field(
        default_factory=dict,
        description="Per format the job offers (torchscript, pt2, onnx), its download; "
        "empty until the job succeeds.",
    )
    record: str
    cancel: str


class JobOut(BaseModel):
    id: str
    status: JobStatus
    name: str | None = Field(None, description="What people call it; not unique.")
    tags: list[str] = Field(default_factory=list, description="Its tags, in the order given.")
    notes: str | None = Field(None, description="Why it was run.")
    spec: dict[str, Any]
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    purged_at: dt.datetime | None = Field(
        None,
        description="When the retention policy removed its step metrics and model (its "
        "result and epochs remain); null while they are kept.",
    )
    attempt: int
    worker: str | None = Field(
        description="The worker that ran it (host-gpu-pid): admin keys only."
    )
    device: str | None
    progress: Progress
    result: JobResult | None
    sweep: TrialOf | None = Field(None, description="The sweep this job is a trial of.")
    error: JobError | None
    formats: list[ExportFormat] = Field(
        default_factory=list,
        description="The model formats the job offers for download; empty until it "
        "succeeds, and once its model is purged.",
    )
    default_format: ExportFormat | None = Field(
        None,
        description="The best format the job offers, the one GET /jobs/{id}/model sends "
        "without ?format= (TorchScript, else ONNX, else pt2); null while it offers none.",
    )
    links: Links


class JobPage(BaseModel):
    items: list[JobOut]
    next: str | None = Field(description="Cursor for the next page, or null at the end.")


# One step as the API answers it: the fields of the trainer's StepMetrics and of the
# StepMetric row, in a schema of its own that documents the response in OpenAPI and keeps
# torch (core.train's) out of the API's start-up; tests/unit/test_step_record.py keeps the
# three equal.
class MetricPoint(BaseModel):
    step: int
    epoch: int
    loss: float
    lr: float
    images_per_second: float
    memory_allocated: int = Field(description="Bytes; 0 on the CPU.")
    memory_reserved: int
    memory_peak: int
    time: float = Field(description="Unix time at the end of the step.")


METRIC_FIELDS = tuple(MetricPoint.model_fields)


class MetricPage(BaseModel):
    items: list[MetricPoint]
    next: int = Field(description="Pass as `after` to get the steps that follow.")
    status: JobStatus


class EpochOut(BaseModel):
    epoch: int
    step: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    duration_s: float
    images_per_second: float


class ConfusionOut(BaseModel):
    """One epoch's class figures on the test split (core.train.class_metrics)."""

    epoch: int
    classes: list[str] = Field(description="The class names, in class-number order.")
    confusion: list[list[int]] = Field(
        description="Test images counted by true class (row) and predicted class (column)."
    )
    class_counts: list[int] = Field(description="Test images per class: each row's sum.")
    per_class_accuracy: list[float | None] = Field(
        description="Each class's share predicted right; null for a class with no test image."
    )
    top5_accuracy: float | None = Field(
        description="Share with the true class among the five most probable; only for sets "
        "of more than ten classes, else null."
    )
    test_accuracy: float


class VersionsOut(BaseModel):
    trainq: str = Field(description="The trainq package's version.")
    spec: str = Field(description="Its JobSpec's version (a hash of the spec's schema).")
    schema_revision: str | None = Field(description="The schema revision its migrations end at.")


class WorkerOut(BaseModel):
    name: str
    state: str
    current_job: str | None
    versions: VersionsOut | None = Field(
        None, description="What the worker runs; null for a trainq that registered none."
    )


class Health(BaseModel):
    status: str = Field(description="ok, or degraded when the database or Redis is away.")
    database: bool
    database_problem: str | None = None  # why the database is away; None where it is not
    redis: bool
    redis_problem: str | None = None  # why Redis is away; None where it is not
    queue_depth: int | None
    workers: list[WorkerOut]
    database_schema: str | None = None  # the database's revision; None where it is away


class Problem(BaseModel):
    detail: Any


QUOTA_REFUSAL = "Past one of the key's quotas: the body names it; Retry-After where waiting helps."


class QuotaProblem(BaseModel):
    """A 429 past a quota (core.quotas)."""

    detail: str = Field(description="What was refused and what to do.")
    limit: str = Field(description="The limit: max_queued, max_train_hours_per_day, ...")
    value: float = Field(description="The limit's value for this key.")
    usage: float = Field(description="What the key uses of it now.")
    owner: str = Field(description="The key's owner id.")
    retry_after_s: int | None = Field(description="As Retry-After; null: waiting won't help.")


class OwnerUsage(BaseModel):
    owner: str | None = Field(description="The owner id (null: jobs enqueued without one).")
    limits: Limits = Field(description="In force: the defaults, overridden; null: no limit.")
    overridden: list[str] = Field(description="The limits an admin set for this owner.")
    usage: Usage


class UsageReport(BaseModel):
    caller: OwnerUsage = Field(description="The calling key's own.")
    owners: list[OwnerUsage] = Field(
        description="For an admin key, every owner with jobs, data sets or overrides; empty "
        "for any other."
    )


class QuotaOut(BaseModel):
    owner: str
    overrides: dict[str, int | float | None] = Field(
        description="The limits an admin set for this owner (null: no limit); the others "
        "are the defaults."
    )
    limits: Limits = Field(description="In force.")


class QuotaList(BaseModel):
    defaults: Limits = Field(description="TRAINQ_QUOTA_*: what an owner without overrides has.")
    quotas: list[QuotaOut] = Field(description="Every owner with overrides.")


class DatasetOut(BaseModel):
    id: str
    name: str
    dataset: str = Field(description='What a job spec names it by: "ds:<id>".')
    sha256: str = Field(description="Of the canonical .npz (uint8 N×C×H×W images, labels).")
    size: int = Field(description="Bytes of the canonical .npz.")
    image_shape: list[int] = Field(description="[C, H, W] of every image.")
    num_classes: int
    train_count: int
    test_count: int = Field(description="The val split's images (a job's test set).")
    created_at: dt.datetime
    classes: list[str] | None = Field(
        None, description="The class names by number (folder names); null: numbered classes."
    )
    class_counts: dict[str, list[int]] | None = Field(
        None, description='Images per class of each split: "train", "val", and "holdout" '
        "(an archive's test/ folder, kept apart). Null for sets uploaded before it was kept."
    )  # fmt: skip
    holdout_count: int | None = None
    mean: list[float] | None = Field(None, description="Per channel, train pixels in [0, 1].")
    std: list[float] | None = None
    preprocessing: dict[str, Any] | None = Field(
        None, description="Photos: image_size, fit, channels, and notes on what was done."
    )
    skipped: list[dict[str, str]] | None = Field(
        None, description="Files left out ({file, reason}): links, and bad images with skip_bad."
    )
    thumbnails: list[list[str]] | None = Field(
        None, description="Per class, the paths of a few train images as PNGs (photo sets)."
    )


class TrialOut(BaseModel):
    number: int
    job_id: str
    status: JobStatus
    params: dict[str, Any]
    value: float | None = Field(description="The objective at its last epoch's end.")
    values: list[float] = Field(description="The objective at each epoch's end.")
    train_loss: list[float] = Field(description="Per epoch.")
    test_loss: list[float] = Field(description="Per epoch.")
    error: JobError | None = Field(description="Why it was pruned, failed or canceled.")
    links: dict[str, str]


class BestTrial(BaseModel):
    number: int
    job_id: str
    value: float
    params: dict[str, Any]
    links: dict[str, str] = Field(description="The trial's job, and its model.")


class SweepBudget(BaseModel):
    trials: int = Field(description="The budget: trials in all.")
    created: int = Field(description="Trials asked for so far.")
    in_flight: int = Field(description="Queued or running now.")
    ended: int
    pruned: int
    epochs: int = Field(description="Epochs trained by all trials: the compute spent.")


class SweepOut(BaseModel):
    id: str
    status: str = Field(description="running, succeeded, failed (no trial completed), canceled.")
    name: str | None = None
    tags: list[str] = Field(default_factory=list, description="Each new trial starts with them.")
    notes: str | None = None
    spec: dict[str, Any] = Field(description="The sweep as submitted.")
    objective: dict[str, str]
    created_at: dt.datetime
    finished_at: dt.datetime | None
    waiting: str | None = Field(
        description="Why fewer trials are in flight than `parallel` (a quota), or null."
    )
    budget: SweepBudget
    best: BestTrial | None = Field(description="The completed trial with the best objective.")
    trials: list[TrialOut]
    links: dict[str, str]


class SweepPage(BaseModel):
    items: list[SweepOut]
    next: str | None = Field(description="Cursor for the next page, or null at the end.")

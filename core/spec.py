"""`JobSpec`: the one definition of a training job, shared by the API, the queue payload,
the trainer and the database.
See docs/api.md ("The job spec")."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.model_sizes import model_too_large
from core.recipes import KNOBS, RECIPES, Recipe, recipe_problem, with_recipe
from core.spec_enums import (
    TERMINAL,
    Amp,
    Architecture,
    Augment,
    DataPath,
    ExportFormat,
    JobStatus,
    Optimizer,
    Priority,
    Scheduler,
)
from core.torchvision_weights import TORCHVISION_WEIGHTS

# The enums are core.spec_enums's, re-exported: `from core.spec import X` for each.
__all__ = [
    "TERMINAL",
    "Amp",
    "Architecture",
    "Augment",
    "DataPath",
    "ExportFormat",
    "JobSpec",
    "JobStatus",
    "Optimizer",
    "Priority",
    "Recipe",
    "Scheduler",
]

DATASETS = ("mnist", "fashion-mnist", "mnist-sample")
# Named by specs once and offered no longer: no registry here ships them. Stored jobs that
# name one still read (the database keeps specs as plain JSON); a new spec is refused.
RETIRED_DATASETS = {"kmnist": "no package registry ships KMNIST"}
USER_DATASET_PREFIX = "ds:"  # "ds:<uuid>": a data set uploaded through POST /datasets
USER_DATASETS = ("datasets", "by-id")  # where, under the data folder, workers place them
BUILT_IN_IMAGES = ((1, 28, 28), 10)  # every built-in set's (C, H, W) and classes


def user_dataset_id(name: str) -> str | None:
    """The uuid of a "ds:<uuid>" data set name, or None for a built-in name."""
    return name.removeprefix(USER_DATASET_PREFIX) if name.startswith(USER_DATASET_PREFIX) else None


PositiveFloat = Annotated[float, Field(gt=0)]


class JobSpec(BaseModel):
    """Hyperparameters of one training run. Unknown fields, NaN and infinities are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    recipe: Recipe = Field(
        Recipe.accurate,
        title="Recipe",
        description="Defaults for the training knobs the spec leaves out "
        f"({', '.join(KNOBS)}): accurate (99.6% on MNIST in 8 epochs) or fast (one epoch, "
        "99% on MNIST).",
        # [knob, value] pairs: the OpenAPI document leaves out null values of objects.
        json_schema_extra={
            "x-recipes": {r.value: list(map(list, k.items())) for r, k in RECIPES.items()}
        },
    )
    recipe_filled: tuple[str, ...] = Field(
        (),
        title="Filled by the recipe",
        max_length=len(KNOBS),
        description="Set by trainq: the knobs the recipe filled, each at the recipe's value.",
        json_schema_extra={"readOnly": True},
    )
    dataset: str = Field(
        "mnist-sample",
        title="Data set",
        max_length=64,
        description="Which data set to train on: one of "
        f'{", ".join(DATASETS)}, or "ds:<id>" for one uploaded with POST /datasets.',
        examples=["mnist-sample", "ds:3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"],
    )
    epochs: int = Field(
        8, title="Epochs", ge=1, le=200, description="Passes over the training set."
    )
    batch_size: int = Field(
        64, title="Batch size", ge=1, le=65536, description="Images per training step."
    )
    lr: float = Field(1e-3, title="Learning rate", gt=0, le=10, description="Peak learning rate.")
    weight_decay: float = Field(
        1e-4, title="Weight decay", ge=0, le=1, description="Decoupled weight decay."
    )
    optimizer: Optimizer = Field(Optimizer.adamw, title="Optimizer")
    momentum: float = Field(
        0.9, title="Momentum", ge=0, lt=1, description="SGD momentum (SGD only)."
    )
    scheduler: Scheduler = Field(Scheduler.cosine, title="Learning-rate schedule")
    min_lr: float = Field(
        1e-5,
        title="Final learning rate",
        ge=0,
        le=10,
        description="Where the cosine schedule ends.",
    )
    amp: Amp = Field(
        Amp.auto,
        title="Mixed precision",
        description="Mixed precision: auto, fp16 (CUDA), bf16 or off.",
    )
    grad_clip_norm: PositiveFloat | None = Field(
        None,
        title="Gradient clipping norm",
        le=1e6,
        description="Clip the global gradient norm to this value.",
    )
    label_smoothing: float = Field(
        0.1,
        title="Label smoothing",
        ge=0,
        le=0.5,
        description="Soften the targets: helps small data sets generalise.",
    )
    augment: Augment = Field(
        Augment.affine,
        title="Augmentation",
        description="Augment each training image on the device: affine (rotate ±10°, zoom "
        "±10%, shift ±8%), shift only, photo (crop, flip, colour jitter: not for digits), or none.",
    )
    ema_decay: float | None = Field(
        0.999,
        title="EMA decay",
        ge=0.5,
        lt=1,
        description="Evaluate and export an exponential moving average of the weights, "
        "updated every step with this decay; null trains and exports the raw weights.",
    )
    channels_last: bool = Field(
        True,
        title="Channels-last memory format",
        description="NHWC memory format for the conv layers.",
    )
    compile: bool = Field(
        False, title="torch.compile", description="torch.compile the model (CUDA graphs on GPU)."
    )
    gradient_checkpointing: bool = Field(
        False,
        title="Gradient checkpointing",
        description="Recompute the second conv block in backward to save memory.",
    )
    seed: int = Field(0, title="Random seed", ge=0, le=2**31 - 1)
    data_path: DataPath = Field(DataPath.device, title="Data path")
    num_workers: int = Field(
        2,
        title="DataLoader workers",
        ge=0,
        le=32,
        description="DataLoader workers (dataloader path).",
    )
    pin_memory: bool = Field(
        True, title="Pinned memory", description="Pinned host batches (dataloader path, CUDA)."
    )
    persistent_workers: bool = Field(
        True,
        title="Persistent DataLoader workers",
        description="Keep DataLoader workers between epochs.",
    )
    prefetch_factor: int = Field(
        2, title="Prefetch factor", ge=1, le=16, description="Batches each worker prefetches."
    )
    model: Architecture = Field(
        Architecture.cnn,
        title="Architecture",
        description="cnn (the seed's CNN), resnet18, resnet34, mobilenet_v3_small, "
        "mobilenet_v3_large, efficientnet_b0 (torchvision's) or efficientnet_lite0; stems "
        "fitted to small images.",
    )
    pretrained: bool = Field(
        False,
        title="Pretrained weights",
        description="Start from ImageNet weights (every model but cnn; torchvision's need their "
        "file installed; not with init_from).",
    )
    init_from: str | None = Field(
        None,
        title="Start from job",
        max_length=36,
        description="The id of one of your own succeeded jobs of the same architecture: start "
        "from its trained weights (a new class layer when the classes differ).",
    )
    freeze_backbone: bool = Field(
        False,
        title="Freeze backbone",
        description="Train only the classifier (init_from or pretrained only).",
    )
    backbone_lr_scale: float = Field(
        1.0, title="Backbone learning-rate scale", gt=0, le=1,
        description="The backbone learns at lr times this; the classifier at lr (init_from or "
        "pretrained only).",
    )  # fmt: skip
    conv1_channels: int = Field(32, title="First conv layer channels", ge=1, le=512)
    conv2_channels: int = Field(64, title="Second conv layer channels", ge=1, le=1024)
    conv3_channels: int = Field(
        128,
        title="Third conv layer channels",
        ge=0,
        le=2048,
        description="A third conv block (0: the seed's two blocks).",
    )
    hidden: int = Field(
        128, title="Hidden units", ge=1, le=8192, description="Width of the fully connected layer."
    )
    max_duration_s: PositiveFloat | None = Field(
        None,
        title="Time limit (s)",
        le=7 * 24 * 3600,
        description="Stop with code `timeout` past this many seconds.",
    )
    target_accuracy: float | None = Field(
        None,
        title="Target accuracy",
        gt=0,
        le=1,
        description="Stop early once an epoch's test accuracy reaches this.",
    )
    max_restarts: int = Field(
        2,
        title="Restarts after a lost worker",
        ge=0,
        le=20,
        description="Requeues after a lost worker.",
    )
    max_steps: int | None = Field(
        None,
        title="Step limit",
        ge=1,
        le=10**9,
        description="Stop after this many steps in all (smoke runs).",
    )

    priority: Priority = Field(
        Priority.normal,
        title="Priority",
        description="Orders this key's own queued jobs (low, normal, high). Between keys, a "
        "free worker takes the job of the key with the fewest jobs running.",
    )

    export: tuple[ExportFormat, ...] = Field(
        tuple(ExportFormat),
        title="Model formats",
        min_length=1,
        max_length=len(ExportFormat),
        description="The formats to export the trained model in, each verified against the "
        "trained model's logits: torchscript, pt2 (torch.export), onnx. A format that fails "
        "its check is not offered (the run record says why); TorchScript, when asked, must "
        "pass or the job fails.",
        json_schema_extra={"uniqueItems": True},
    )

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, v: str) -> str:
        if v in DATASETS:
            return v
        if v in RETIRED_DATASETS:
            raise ValueError(
                f"data set {v!r} is no longer offered ({RETIRED_DATASETS[v]}): upload it with "
                f'POST /datasets and name it "ds:<id>", or use one of {", ".join(DATASETS)}'
            )
        ds_id = user_dataset_id(v)
        if ds_id is not None:
            try:
                return USER_DATASET_PREFIX + str(uuid.UUID(ds_id))  # canonical: lower case
            except ValueError:
                pass
        raise ValueError(
            f'unknown data set {v!r}: use one of {", ".join(DATASETS)}, or "ds:<id>" with '
            "the id of a data set uploaded with POST /datasets"
        )

    @field_validator("init_from")
    @classmethod
    def _job_id(cls, v: str | None) -> str | None:
        try:
            return None if v is None else str(uuid.UUID(v))  # canonical: lower case
        except ValueError:
            raise ValueError(f"init_from must be a job id, not {v!r}") from None

    @field_validator("export")
    @classmethod
    def _distinct_formats(cls, v: tuple[ExportFormat, ...]) -> tuple[ExportFormat, ...]:
        if len(set(v)) != len(v):
            raise ValueError("each format at most once")
        return v

    @model_validator(mode="before")
    @classmethod
    def _recipe(cls, data: Any) -> Any:
        return with_recipe(data) if isinstance(data, dict) else data

    def submitted(self) -> dict[str, Any]:
        """The fields as they were given: without what the recipe filled, which a spec
        built from this one (a sweep's trial) gets from its own recipe."""
        return self.model_dump(mode="json", exclude={*self.recipe_filled, "recipe_filled"})

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        problem = recipe_problem(self.recipe, self.recipe_filled, dict(self))
        if problem:
            raise ValueError(problem)
        if self.scheduler is Scheduler.cosine and self.min_lr > self.lr:
            raise ValueError("min_lr must not exceed lr for the cosine schedule")
        problem = _architecture_problem(self)
        if problem:
            raise ValueError(problem)
        if user_dataset_id(self.dataset) is None:
            problem = model_too_large(self, *BUILT_IN_IMAGES)
            if problem:
                raise ValueError(problem)
        return self


# The architectures with ImageNet weights: EfficientNet-Lite0's packaged ones
# (core.train.pretrained), torchvision's from TORCH_HOME (core.torchvision_weights).
PRETRAINED = (*TORCHVISION_WEIGHTS, Architecture.efficientnet_lite0)
CNN_ONLY = ("conv1_channels", "conv2_channels", "conv3_channels", "hidden")  # and checkpointing


def _architecture_problem(spec: JobSpec) -> str | None:
    """Fields that the spec's architecture or its start do not take, named; or None."""
    if spec.model is not Architecture.cnn:
        changed = [f for f in CNN_ONLY if getattr(spec, f) != JobSpec.model_fields[f].default]
        if changed := changed + ["gradient_checkpointing"] * spec.gradient_checkpointing:
            return f"{', '.join(changed)}: for model cnn only, not {spec.model}; leave them out"
    if spec.pretrained and spec.model not in PRETRAINED:
        offered = ", ".join(PRETRAINED)
        return f"pretrained: ImageNet weights are offered for {offered}, not {spec.model}"
    if spec.pretrained and spec.init_from is not None:
        return "pretrained and init_from both choose the starting weights: pick one"
    starts = spec.init_from is not None or spec.pretrained
    if not starts and (spec.freeze_backbone or spec.backbone_lr_scale != 1):
        return (
            "freeze_backbone and backbone_lr_scale need init_from (a job to start from) "
            "or pretrained"
        )
    return None


# What a stored spec meant before each of these fields existed: the recipe then. A job's
# row holds its whole spec as submitted, so a row without one of them was submitted before
# it existed, and trains (and resumes its checkpoints) with the recipe it was submitted with.
BEFORE_FIELD: dict[str, object] = {
    "export": [ExportFormat.torchscript],
    "augment": Augment.none,
    "ema_decay": None,
    "conv3_channels": 0,
    "recipe": "accurate",
    "recipe_filled": [],  # what filled the rest was not written down then
}


def stored_spec(raw: Any) -> JobSpec:
    """A spec as stored in a job's row (JobSpec.model_dump), read with the meaning it had
    when it was stored. Raises pydantic's ValidationError as model_validate does."""
    if isinstance(raw, dict):
        raw = {**{k: v for k, v in BEFORE_FIELD.items() if k not in raw}, **raw}
    return JobSpec.model_validate(raw)


def spec_version(model: type[BaseModel]) -> str:
    """A short name (12 hex digits) for what a model of specs accepts: a hash of its JSON
    schema without the words for people (titles, descriptions, examples). The API writes
    it into each job's row; a worker that cannot read a row written under another one is
    older or newer than the API, not handed a bad spec (worker.admission)."""
    schema = json.dumps(_without_prose(model.model_json_schema()), sort_keys=True)
    return hashlib.sha256(schema.encode()).hexdigest()[:12]


def _without_prose(node: Any) -> Any:
    if isinstance(node, dict):
        prose = ("title", "description", "examples")
        return {k: _without_prose(v) for k, v in node.items() if k not in prose}
    if isinstance(node, list):
        return [_without_prose(v) for v in node]
    return node


SPEC_VERSION = spec_version(JobSpec)

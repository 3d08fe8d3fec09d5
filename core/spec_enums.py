"""The enums of a job spec (core.spec re-exports each): statuses, precisions, optimisers,
schedules, augmentations, architectures, priorities, data paths and export formats.
See docs/api.md ("The job spec")."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """One status enum for the DB column, the API schema, the stream, the client and the worker."""

    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    canceled = "canceled"
    pruned = "pruned"  # a sweep's trial stopped by its pruner at an epoch's end (core.sweeps)

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.canceled, JobStatus.pruned})


class Amp(StrEnum):
    auto = "auto"  # the fastest correct choice for the device (see core.train.device)
    fp16 = "fp16"  # CUDA only, with a GradScaler
    bf16 = "bf16"  # no scaler needed
    off = "off"


class Optimizer(StrEnum):
    adamw = "adamw"
    sgd = "sgd"


class Scheduler(StrEnum):
    cosine = "cosine"
    onecycle = "onecycle"
    none = "none"


class Augment(StrEnum):
    none = "none"
    shift = "shift"  # a random shift of up to 8% of the side, per image
    affine = "affine"  # a random rotation (±10°), zoom (±10%) and shift (±8%), per image
    photo = "photo"  # random resized crop, horizontal flip, light colour jitter, per image


class Architecture(StrEnum):
    """The model a job trains (docs/models.md): the seed's CNN or a torchvision builder."""

    cnn = "cnn"
    resnet18 = "resnet18"
    resnet34 = "resnet34"
    mobilenet_v3_small = "mobilenet_v3_small"
    mobilenet_v3_large = "mobilenet_v3_large"
    efficientnet_b0 = "efficientnet_b0"
    efficientnet_lite0 = "efficientnet_lite0"  # core.train.pretrained: ImageNet weights offered


class Priority(StrEnum):
    """Orders one owner's own queued jobs; fair share between owners comes first."""

    low = "low"
    normal = "normal"
    high = "high"

    @property
    def rank(self) -> int:
        """The value stored in the jobs table's `priority` column: higher runs sooner."""
        return {Priority.low: -1, Priority.normal: 0, Priority.high: 1}[self]


class DataPath(StrEnum):
    device = "device"  # the whole set held on the device as uint8, batches cut by index
    dataloader = "dataloader"  # the classic torch DataLoader over torchvision transforms


class ExportFormat(StrEnum):
    """The formats a trained model leaves in; each is verified against the trained logits."""

    torchscript = "torchscript"  # torch.jit.load: the default download, always supported
    pt2 = "pt2"  # torch.export.load(...).module()
    onnx = "onnx"  # onnxruntime.InferenceSession, or any ONNX runtime

    @property
    def suffix(self) -> str:
        return _SUFFIXES[self]


_SUFFIXES = {ExportFormat.torchscript: ".pt", ExportFormat.pt2: ".pt2", ExportFormat.onnx: ".onnx"}

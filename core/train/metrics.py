"""What a run reports: per step, per epoch, at its start and at its end, and the callbacks
that carry it out of the trainer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from core.spec import ExportFormat


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """One training step: the one definition of a step's fields. The database's step rows
    and the API's metric points are built from these fields."""

    step: int  # 1-based, counted over the whole run
    epoch: int  # 1-based
    loss: float
    lr: float  # the learning rate this step used
    images_per_second: float
    memory_allocated: int  # bytes; 0 on the CPU
    memory_reserved: int
    memory_peak: int
    time: float  # unix time at the end of the step


@dataclass(frozen=True, slots=True)
class EpochMetrics:
    epoch: int
    step: int  # the last step of this epoch
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    duration_s: float  # training steps and evaluation
    images_per_second: float  # training steps only
    # On the test split: classes, confusion (rows true, columns predicted),
    # per_class_accuracy, top5_accuracy (core.train.class_metrics); None in older rows.
    class_metrics: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class RunInfo:
    device: str
    total_steps: int
    steps_per_epoch: int
    start_step: int  # > 0 when resumed from a checkpoint
    amp: str


@dataclass
class Callbacks:
    """All optional. `on_steps` receives every step exactly once, in order, in blocks."""

    on_start: Callable[[RunInfo], None] | None = None
    on_steps: Callable[[Sequence[StepMetrics]], None] | None = None
    on_epoch: Callable[[EpochMetrics], None] | None = None
    on_checkpoint: Callable[[int, bytes], None] | None = None  # (epoch, checkpoint bytes)
    should_stop: Callable[[], bool] | None = None  # checked between steps
    # Called as each piece of step-free work ends (data load and placement, model build,
    # checkpoint load, each evaluation batch, export): with `on_steps` and the others it
    # tells a watcher that a slow phase is still moving, and silence that it is hung.
    on_progress: Callable[[], None] | None = None
    # Checked between steps too: True stops the run with a mid-epoch checkpoint
    # (TrainingPreempted), from which a resume continues at the next step.
    should_preempt: Callable[[], bool] | None = None


@dataclass(frozen=True, slots=True)
class ExportedModel:
    """One format of the trained model, verified against its logits."""

    format: ExportFormat
    data: bytes
    sha256: str


@dataclass
class TrainResult:
    epochs: list[EpochMetrics]
    steps: int
    test_accuracy: float
    test_loss: float
    train_loss: float
    images_per_second: float
    duration_s: float
    models: dict[ExportFormat, ExportedModel]  # the spec's formats that passed their check
    record: dict[str, Any]
    stopped_early: str | None = None
    weights: bytes = b""  # the evaluated model's state_dict (core.train.run.Run.weights)

    def summary(self) -> dict[str, Any]:
        return {
            "test_accuracy": self.test_accuracy,
            "test_loss": self.test_loss,
            "train_loss": self.train_loss,
            "images_per_second": self.images_per_second,
            "duration_s": self.duration_s,
            "epochs": len(self.epochs),
            "steps": self.steps,
            "stopped_early": self.stopped_early,
        }

"""The trainer: pure PyTorch. No web, queue or database imports; it reports through callbacks."""

from core.train.loop import (
    Callbacks,
    EpochMetrics,
    RunInfo,
    StepMetrics,
    TrainResult,
    is_out_of_memory,
    train,
)

__all__ = [
    "Callbacks",
    "EpochMetrics",
    "RunInfo",
    "StepMetrics",
    "TrainResult",
    "is_out_of_memory",
    "train",
]

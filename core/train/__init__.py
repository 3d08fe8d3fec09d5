"""The trainer: pure PyTorch. No web, queue or database imports; it reports through callbacks.
See docs/performance.md."""

from core.train.loop import is_out_of_memory, train
from core.train.metrics import Callbacks, EpochMetrics, RunInfo, StepMetrics, TrainResult

__all__ = [
    "Callbacks",
    "EpochMetrics",
    "RunInfo",
    "StepMetrics",
    "TrainResult",
    "is_out_of_memory",
    "train",
]

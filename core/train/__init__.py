"""The trainer: pure PyTorch. No web, queue or database imports; it reports through callbacks."""

from core.train.loop import Callbacks, EpochMetrics, StepMetrics, TrainResult, train

__all__ = ["Callbacks", "EpochMetrics", "StepMetrics", "TrainResult", "train"]

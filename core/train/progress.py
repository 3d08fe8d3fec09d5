"""How far an epoch has come (EpochProgress, kept in a mid-epoch checkpoint) and its
figures once trained (EpochStats). See docs/jobs.md."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class EpochStats:
    """The training figures of an epoch, or (`then`) of the epochs a run trained so far."""

    last_step: int
    loss: float
    accuracy: float
    images: int
    step_seconds: float
    earlier_s: float = 0.0  # wall time of this epoch before its mid-epoch resume

    def then(self, epoch: EpochStats) -> EpochStats:
        """These epochs and the next: images and step time add up, the rest is the next's."""
        return dataclasses.replace(
            epoch,
            images=self.images + epoch.images,
            step_seconds=self.step_seconds + epoch.step_seconds,
        )


@dataclass
class EpochProgress:
    """How far an epoch has come. A mid-epoch checkpoint keeps it, so that a resume trains
    only the epoch's remaining batches and its train loss and accuracy count every batch once."""

    epoch: int
    position: int  # batches of this epoch already trained
    loss_sum: torch.Tensor  # sum of loss * batch size, on the device
    correct: torch.Tensor
    images: int = 0
    step_seconds: float = 0.0  # of the steps before a resume
    elapsed_s: float = 0.0  # wall time before a resume

    @classmethod
    def start(cls, epoch: int, dev: torch.device) -> EpochProgress:
        zero = torch.zeros((), device=dev)
        return cls(epoch, 0, zero, torch.zeros((), dtype=torch.long, device=dev))

    def state(self, step_seconds: float, elapsed_s: float) -> dict[str, Any]:
        return {
            "position": self.position,
            "loss_sum": self.loss_sum,
            "correct": self.correct,
            "images": self.images,
            "step_seconds": self.step_seconds + step_seconds,
            "elapsed_s": self.elapsed_s + elapsed_s,
        }

    def count(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """One more batch trained: its loss and hits, summed on the device (no sync)."""
        n = labels.shape[0]
        self.position += 1
        self.images += n
        with torch.no_grad():
            self.loss_sum += loss * n
            self.correct += (logits.argmax(1) == labels).sum()

    def stats(self, last_step: int, step_seconds: float) -> EpochStats:
        """The epoch's figures once its last batch is trained (reads the sums: one sync)."""
        images = max(self.images, 1)
        return EpochStats(
            last_step=last_step,
            loss=self.loss_sum.item() / images,
            accuracy=self.correct.item() / images,
            images=self.images,
            step_seconds=self.step_seconds + step_seconds,
            earlier_s=self.elapsed_s,
        )

    @classmethod
    def from_state(cls, epoch: int, state: dict[str, Any]) -> EpochProgress:
        return cls(
            epoch=epoch,
            position=int(state["position"]),
            loss_sum=state["loss_sum"],
            correct=state["correct"],
            images=int(state["images"]),
            step_seconds=float(state["step_seconds"]),
            elapsed_s=float(state["elapsed_s"]),
        )

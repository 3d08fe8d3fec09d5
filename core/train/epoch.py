"""One epoch of training: the loop over its batches, with the checks between steps (stop,
deadline, preemption), and how far it has come (kept in a mid-epoch checkpoint)."""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from core.errors import TrainingPreempted, TrainingStopped, TrainingTimeout
from core.train.metrics import Callbacks
from core.train.step_buffer import StepBuffer

if TYPE_CHECKING:
    from core.train.run import Run


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


@dataclass(frozen=True)
class Limits:
    """What bounds a run's epochs: its last step, its deadline, and how often steps leave."""

    total_steps: int
    deadline: float | None  # time.perf_counter() past which the run times out
    flush_steps: int
    flush_seconds: float


def train_epoch(run: Run, epoch: int, step: int, cb: Callbacks, limits: Limits) -> EpochStats:
    """Train `epoch` from `step` (or from where its mid-epoch checkpoint left it)."""
    run.model.train()
    started = time.perf_counter()
    progress = run.progress_of(epoch)
    out = StepBuffer(run.dev, limits.flush_steps, cb.on_steps)
    # The order depends only on (seed, epoch): a mid-epoch resume skips what was trained.
    for x, y in itertools.islice(run.batches.epoch(epoch), progress.position, None):
        if step >= limits.total_steps:
            break
        _stop_if_asked(run, cb, limits, out, progress, (epoch, step, started))
        lr = float(run.scheduler.get_last_lr()[0])
        loss, logits = run.step(x, y)
        step += 1
        progress.count(loss, logits, y)
        out.add(step, epoch, loss, lr, y.shape[0])
        if out.due(limits.flush_seconds):
            out.flush()
    out.flush()
    return progress.stats(step, out.step_seconds)


def _stop_if_asked(
    run: Run,
    cb: Callbacks,
    limits: Limits,
    out: StepBuffer,
    progress: EpochProgress,
    at: tuple[int, int, float],  # (epoch, the last step done, when the epoch started)
) -> None:
    """Between steps: a stop request, the deadline or a preemption ends the run here, after
    the steps so far have been handed on."""
    epoch, step, started = at
    if cb.should_stop and cb.should_stop():
        out.flush()
        raise TrainingStopped(f"stopped by request at step {step}")
    if limits.deadline is not None and time.perf_counter() > limits.deadline:
        out.flush()
        raise TrainingTimeout(f"max_duration_s {run.spec.max_duration_s} passed at step {step}")
    if cb.should_preempt and cb.should_preempt():
        out.flush()
        within = progress.state(out.step_seconds, time.perf_counter() - started)
        raise TrainingPreempted(epoch, step, run.checkpoint(epoch, step, within))

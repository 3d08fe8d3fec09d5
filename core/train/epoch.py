"""One epoch of training: the loop over its batches, with the checks between steps (stop,
deadline, preemption). How far it has come is core.train.progress."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.errors import TrainingPreempted, TrainingStopped, TrainingTimeout
from core.train.metrics import Callbacks
from core.train.progress import EpochProgress, EpochStats
from core.train.step_buffer import StepBuffer

if TYPE_CHECKING:
    from core.train.run import Run


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

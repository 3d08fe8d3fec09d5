"""The job the state machine drives and one attempt at it, as that attempt's worker sees it."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.train import EpochMetrics, StepMetrics

STEPS_PER_EPOCH = 3
EPOCHS = 2
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS


def epoch_of(step: int) -> int:
    return (step - 1) // STEPS_PER_EPOCH + 1


def point(step: int, attempt: int) -> StepMetrics:
    """A step as attempt `attempt` reports it: its loss names the attempt, so every stored
    or streamed step says who wrote it."""
    return StepMetrics(step, epoch_of(step), float(attempt), 1e-3, 100.0, 0, 0, 0, 0.0)


def epoch_end(step: int, attempt: int) -> EpochMetrics:
    return EpochMetrics(epoch_of(step), step, float(attempt), 0.9, 0.4, 0.9, 1.0, 100.0)


@dataclass
class Attempt:
    """One attempt as its worker sees it."""

    number: int
    start: int  # the step it resumed after (its checkpoint's)
    next: int = field(init=False)  # the next step it makes
    saved_to: int = field(init=False)  # the last epoch end it stored (or its start)
    unsaved: list[StepMetrics] = field(default_factory=list)
    last_block: list[StepMetrics] = field(default_factory=list)
    silent: bool = False  # its worker died or hangs (it may come back: a zombie)
    done: bool = False  # its run returned: it writes nothing more

    def __post_init__(self) -> None:
        self.next = self.start + 1
        self.saved_to = self.start

    @property
    def last_step(self) -> int:
        return self.next - 1

    @property
    def epoch_due(self) -> bool:
        return self.last_step > self.saved_to and self.last_step % STEPS_PER_EPOCH == 0

    @property
    def trained(self) -> bool:
        return self.last_step == TOTAL_STEPS and not self.epoch_due

"""A run asked to hand itself back after step k, and what a resumed run is compared by: its
steps, its epochs' figures, its final weights."""

from __future__ import annotations

import io

import torch

from core.train import Callbacks
from tests.conftest import Recorder


def preempted_at(k: int, rec: Recorder) -> Callbacks:
    """Callbacks that ask for preemption right after step k (the check precedes each step)."""
    calls = 0

    def should_preempt() -> bool:
        nonlocal calls
        calls += 1
        return calls > k

    cb = rec.callbacks()
    cb.should_preempt = should_preempt
    return cb


def weights(checkpoint: bytes) -> dict[str, torch.Tensor]:
    """The model's weights and their moving average (what is evaluated and exported)."""
    state = torch.load(io.BytesIO(checkpoint), weights_only=True)
    ema = {f"ema.{k}": v for k, v in state["ema"]["module"].items()}
    return {**state["model"], **ema, "ema.updates": torch.tensor(state["ema"]["updates"])}


def epoch_figures(rec: Recorder) -> list[tuple[int, int, float, float, float, float]]:
    return [
        (e.epoch, e.step, e.train_loss, e.train_accuracy, e.test_loss, e.test_accuracy)
        for e in rec.epochs
    ]


def steps(rec: Recorder) -> list[tuple[int, int, float, float]]:
    return [(p.step, p.epoch, p.loss, p.lr) for p in rec.steps]

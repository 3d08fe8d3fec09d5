"""An exponential moving average of the weights, evaluated and exported instead of the last
step's weights: it smooths out the noise of the last steps at no cost in training.

Not torch.optim.swa_utils.AveragedModel: its warm-up would read its step count from the
device (a sync every step on a GPU), and a short run needs that warm-up. Here the count is a
Python int, and the update is one foreach lerp over the floating-point state."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


class Ema:
    def __init__(self, model: nn.Module, decay: float) -> None:
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = decay
        self.updates = 0
        self._pairs = list(zip(_state(self.module), _state(model), strict=True))

    def current_decay(self) -> float:
        # Warm-up: the average of a short run is not stuck at its random start (decay 0.999
        # looks back ~1,000 steps; a 300-step run would average mostly its first steps).
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        """After each optimizer step: move the average towards the model's weights (and BN
        statistics); integer buffers (BN's batch count) are copied."""
        self.updates += 1
        weight = 1.0 - self.current_decay()
        floats = [(a, m) for a, m in self._pairs if a.is_floating_point()]
        torch._foreach_lerp_([a for a, _ in floats], [m for _, m in floats], weight)
        for a, m in self._pairs:
            if not a.is_floating_point():
                a.copy_(m)

    @torch.no_grad()
    def restart(self) -> None:
        """Start the average afresh at the model's current weights (a checkpoint that
        holds none: one written before the run averaged, or with ema_decay null)."""
        for a, m in self._pairs:
            a.copy_(m)
        self.updates = 0

    def state_dict(self) -> dict[str, Any]:
        return {"module": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = int(state["updates"])


def _state(model: nn.Module) -> list[torch.Tensor]:
    """Parameters and buffers, in one fixed order, as the tensors themselves (no copies)."""
    return [t.data for t in model.parameters()] + list(model.buffers())

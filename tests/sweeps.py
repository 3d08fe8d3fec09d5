"""A sweep small enough for a test: three trials of two short epochs on mnist-sample. Its
grid's seed 1 draws lr 3e-3 first, so the trial that learns comes first and the pruner (1 in
2 go on) stops each of the two after it at its first epoch."""

from __future__ import annotations

from typing import Any

GRID_BASE: dict[str, Any] = {
    "epochs": 2,
    "batch_size": 128,
    "min_lr": 0,
    "augment": "none",
    "ema_decay": None,
    "conv3_channels": 0,
    "export": ["torchscript"],
}
GRID_SWEEP: dict[str, Any] = {
    "base": GRID_BASE,
    "space": {"lr": {"choice": [3e-3, 2e-6, 1e-6]}},
    "sampler": {"name": "grid", "seed": 1},
    "pruner": {"name": "asha", "min_epochs": 1, "reduction_factor": 2},
    "trials": 3,
    "parallel": 1,
}

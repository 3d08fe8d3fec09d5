"""The step buffer: per-step losses kept on the device and copied out in blocks."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import TrainingDiverged
from core.train import StepMetrics
from core.train.step_buffer import StepBuffer
from tests.conftest import cuda


def _fill(buf: StepBuffer, dev: torch.device, values: list[float]) -> None:
    for i, v in enumerate(values):
        buf.add(i + 1, 1, torch.tensor(v, device=dev), 0.01, 32)


def test_every_step_once_in_order_with_its_loss() -> None:
    got: list[StepMetrics] = []
    buf = StepBuffer(torch.device("cpu"), 8, got.extend)
    values = [2.5 - 0.1 * i for i in range(20)]
    for i, v in enumerate(values):
        buf.add(i + 1, 1, torch.tensor(v), 0.01, 32)
        if buf.due(10.0):
            buf.flush()
    buf.flush()
    assert [p.step for p in got] == list(range(1, 21))
    assert [p.loss for p in got] == pytest.approx(values)


def test_a_non_finite_loss_stops_before_it_is_reported() -> None:
    got: list[StepMetrics] = []
    buf = StepBuffer(torch.device("cpu"), 8, got.extend)
    _fill(buf, torch.device("cpu"), [1.0, 0.9, math.inf, 0.8])
    with pytest.raises(TrainingDiverged, match="step 3"):
        buf.flush()
    assert [p.step for p in got] == [1, 2]


@cuda
def test_flush_reads_the_losses_only_after_the_copy_has_landed() -> None:
    """Work queued after the last step mark delays the device-to-host copy; a flush that
    waited on that mark (recorded before the copy) read the pinned buffer too early."""
    dev = torch.device("cuda")
    got: list[StepMetrics] = []
    buf = StepBuffer(dev, 64, got.extend)
    values = [float(i + 1) for i in range(64)]
    _fill(buf, dev, values)
    big = torch.randn(4096, 4096, device=dev)
    for _ in range(30):  # hundreds of ms of GPU work between the last mark and the copy
        big = big @ big / 64
    buf.flush()
    assert [p.loss for p in got] == values


@cuda
def test_memory_figures_are_the_allocators() -> None:
    """Each step's figures are what torch.cuda.memory_allocated, memory_reserved and
    max_memory_allocated say at that moment."""
    dev = torch.device("cuda")
    got: list[StepMetrics] = []
    buf = StepBuffer(dev, 8, got.extend)
    keep = torch.empty(2**20, device=dev)
    loss = torch.ones((), device=dev)  # held: its block stays allocated while we compare
    buf.add(1, 1, loss, 0.1, 64)
    expected = (
        torch.cuda.memory_allocated(dev),
        torch.cuda.memory_reserved(dev),
        torch.cuda.max_memory_allocated(dev),
    )
    buf.flush()
    (point,) = got
    assert (point.memory_allocated, point.memory_reserved, point.memory_peak) == expected
    assert point.memory_allocated >= keep.numel() * 4

"""Per-step metrics without a host sync per step: losses stay on the device and leave in
blocks."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from core.errors import TrainingDiverged
from core.train.metrics import StepMetrics


class StepBuffer:
    """Per-step losses stay on the device; every `size` steps (or `due` seconds) they are
    copied out in one non-blocking transfer. Step times come from CUDA events on the GPU
    (no sync per step) and from the host clock on the CPU (where every op is synchronous)."""

    def __init__(
        self,
        dev: torch.device,
        size: int,
        sink: Callable[[Sequence[StepMetrics]], None] | None,
    ) -> None:
        self.dev = dev
        self.size = size
        self.sink = sink
        self.cuda = dev.type == "cuda"
        self.losses = torch.empty(size, device=dev)
        self.host = torch.empty(size, pin_memory=self.cuda)
        self.pending: list[tuple[int, int, float, int, tuple[int, int, int]]] = []
        self.step_seconds = 0.0
        self.last_flush = time.perf_counter()
        self.last_mark: Any = self._mark()
        self.marks: list[Any] = []

    def _mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def add(self, step: int, epoch: int, loss: torch.Tensor, lr: float, n: int) -> None:
        self.losses[len(self.pending)].copy_(loss, non_blocking=True)
        self.pending.append((step, epoch, lr, n, self._memory()))
        self.marks.append(self._mark())

    def _memory(self) -> tuple[int, int, int]:
        """(allocated, reserved, peak allocated) bytes, as torch.cuda.memory_allocated,
        memory_reserved and max_memory_allocated give them, in one read of the allocator's
        counters: each of those three flattens every counter into a new dict first, which
        costs a GPU step a tenth of its time at small batch sizes."""
        if not self.cuda:
            return 0, 0, 0
        stats = torch.cuda.memory_stats_as_nested_dict(self.dev)
        allocated = stats.get("allocated_bytes", {}).get("all", {})
        reserved = stats.get("reserved_bytes", {}).get("all", {})
        return allocated.get("current", 0), reserved.get("current", 0), allocated.get("peak", 0)

    def due(self, seconds: float) -> bool:
        return len(self.pending) >= self.size or time.perf_counter() - self.last_flush > seconds

    def flush(self) -> None:
        """Hand the pending steps to the sink; a non-finite loss ends the run there
        (TrainingDiverged), after the steps before it were handed on."""
        if not self.pending:
            return
        losses, durations = self._copy_out()
        bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        points = self._points(losses[:bad], durations)
        self.step_seconds += sum(durations)
        self.last_mark = self.marks[-1]
        diverged = None if bad is None else (self.pending[bad][0], losses[bad])
        self.pending.clear()
        self.marks.clear()
        self.last_flush = time.perf_counter()
        if self.sink and points:
            self.sink(points)
        if diverged is not None:
            raise TrainingDiverged(
                f"the loss became {diverged[1]} at step {diverged[0]}; try a lower lr, "
                "grad_clip_norm, or amp 'bf16'/'off'"
            )

    def _copy_out(self) -> tuple[list[float], list[float]]:
        """The pending losses, read on the host, and each step's duration in seconds."""
        k = len(self.pending)
        self.host[:k].copy_(self.losses[:k], non_blocking=True)
        if self.cuda:
            # A non-blocking copy is done only once an event recorded AFTER it has completed:
            # the last step mark was recorded before the copy, so waiting on it could read the
            # pinned buffer before the copy lands (stale or uninitialised losses).
            copied = torch.cuda.Event()
            copied.record()
            copied.synchronize()
            durations = [a.elapsed_time(b) / 1000 for a, b in _pairs(self.last_mark, self.marks)]
        else:
            durations = [b - a for a, b in _pairs(self.last_mark, self.marks)]
        return self.host[:k].tolist(), durations

    def _points(self, losses: list[float], durations: list[float]) -> list[StepMetrics]:
        now = time.time()
        return [
            StepMetrics(
                step=step,
                epoch=epoch,
                loss=loss,
                lr=lr,
                images_per_second=n / max(dt, 1e-9),
                memory_allocated=mem[0],
                memory_reserved=mem[1],
                memory_peak=mem[2],
                time=now,
            )
            for (step, epoch, lr, n, mem), loss, dt in zip(
                self.pending, losses, durations, strict=False
            )
        ]


def _pairs(first: Any, rest: list[Any]) -> Iterator[tuple[Any, Any]]:
    prev = first
    for m in rest:
        yield prev, m
        prev = m

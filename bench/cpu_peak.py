"""How near trainq's training step comes to the CPU's peak, and where the rest goes.

1. The peak, measured: a square matrix product (2,048²) in bf16 and in fp32 on every thread
   torch uses, best of several; 2n³ floating-point operations each.
2. trainq's step (core.train.run.Run.step, the batches the trainer cuts on the device,
   augmentation included) for each recipe's spec on the full MNIST: images/s, the step's
   floating-point operations (torch.utils.flop_counter, forward and backward), the achieved
   GFLOP/s and its share of the peak of the dtype the step runs in (amp=auto).
3. torch.profiler over the same steps: each op's share of the time, with GFLOP/s where the
   profiler counts its operations (convolutions, matrix products), and the time by kind:
   convolutions, matrix products, the optimizer, the moving average, augmentation, the rest.

4. With --variants: the same step compiled (torch.compile, inductor on the CPU) and in the
   NCHW layout, against trainq's (eager, channels_last), in the same run.

Prints one JSON object.    python -m bench.cpu_peak [--steps 30] [--variants]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.seed import cpu_description
from bench.trainer import bench_data_dir
from core.spec import JobSpec
from core.train.data import load_dataset
from core.train.device import resolve_amp
from core.train.run import Run

KINDS = {  # an op's kind, by the first of these its name holds
    "convolution": ("conv",),
    "matrix product": ("addmm", "mm", "linear", "matmul", "bmm"),
    "optimizer": ("adam", "optimizer", "foreach", "_fused"),
    "moving average": ("lerp",),
    "augmentation": ("grid_sampler", "affine_grid"),
}


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 8) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def make_run(recipe: str, **knobs: Any) -> Run:
    spec = JobSpec.model_validate({"dataset": "mnist", "recipe": recipe, **knobs})
    dev = torch.device("cpu")
    data = load_dataset("mnist", bench_data_dir())
    return Run(spec, dev, resolve_amp(spec.amp, dev), data, lambda: None, data.normalization)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, marks in KINDS.items():
        if any(m in low for m in marks):
            return kind
    return "the rest"


Batches = Iterator[tuple[torch.Tensor, torch.Tensor]]


def steps(run: Run, it: Batches, n: int) -> None:
    """n steps, each on the next batch the trainer would cut (augmentation included)."""
    for x, y in itertools.islice(it, n):
        run.step(x, y)


def profiled(run: Run, it: Batches, n: int, flops_by_kind: dict[str, float]) -> dict[str, Any]:
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True
    ) as prof:
        steps(run, it, n)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    by_kind: dict[str, float] = defaultdict(float)
    for e in events:
        by_kind[kind_of(e.key)] += e.self_cpu_time_total
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
    return {
        "time_share_by_kind": {k: round(v / total, 3) for k, v in sorted(by_kind.items())},
        # A kind's operations a step (flop_counter) over its time a step (the profiler).
        "gflop_per_s_by_kind": {
            k: round(f * n / by_kind[k] / 1e3, 1) for k, f in flops_by_kind.items() if by_kind[k]
        },
        "top_ops": [
            {
                "op": e.key,
                "time_share": round(e.self_cpu_time_total / total, 3),
            }
            for e in top
        ],
    }


def one_recipe(recipe: str, n: int, peaks: dict[str, float]) -> dict[str, Any]:
    run = make_run(recipe)
    it = iter(run.batches.epoch(1))
    steps(run, it, 3)  # warm-up: oneDNN's primitives, the allocator
    with FlopCounterMode(display=False) as counter:
        steps(run, it, 1)
    flops = counter.get_total_flops()
    flops_by_kind: dict[str, float] = defaultdict(float)
    for op, count in counter.get_flop_counts()["Global"].items():
        flops_by_kind[kind_of(str(op))] += count
    started = time.perf_counter()
    steps(run, it, n)
    seconds = (time.perf_counter() - started) / n
    dtype = "bf16" if run.amp_dtype is torch.bfloat16 else "fp32"
    achieved = flops / seconds / 1e9
    return {
        "batch_size": run.spec.batch_size,
        "amp": dtype,
        "step_ms": round(seconds * 1000, 2),
        "images_per_second": round(run.spec.batch_size / seconds),
        "gflop_per_step": round(flops / 1e9, 3),
        "gflop_per_s": round(achieved, 1),
        "share_of_peak": round(achieved / peaks[dtype], 3),
        "profile": profiled(run, it, n, flops_by_kind),
    }


def step_ms(run: Run, n: int, repeats: int = 3) -> float:
    """The best of `repeats` means over n steps, after three to warm up (or compile)."""
    it = iter(run.batches.epoch(1))
    steps(run, it, 3)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        steps(run, it, n)
        best = min(best, (time.perf_counter() - started) / n)
    return best * 1000


def variants(recipe: str, n: int) -> dict[str, Any]:
    """The step as trainq runs it (channels_last, eager) against torch.compile (inductor, on
    the CPU) and against the default NCHW layout, in the same run."""
    ms = {
        "trainq": step_ms(make_run(recipe), n),
        "compiled": step_ms(make_run(recipe, compile=True), n),
        "nchw": step_ms(make_run(recipe, channels_last=False), n),
    }
    return {
        "step_ms": {k: round(v, 2) for k, v in ms.items()},
        "compiled_vs_trainq": round(ms["trainq"] / ms["compiled"], 2),
        "nchw_vs_trainq": round(ms["trainq"] / ms["nchw"], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--variants", action="store_true", help="also torch.compile and NCHW")
    args = p.parse_args()
    peaks = {"bf16": matmul_peak(torch.bfloat16), "fp32": matmul_peak(torch.float32)}
    out: dict[str, Any] = {
        "benchmark": "cpu_peak",
        "cpu": cpu_description(),
        "threads": torch.get_num_threads(),
        "matmul_peak_gflop_per_s": {k: round(v, 1) for k, v in peaks.items()},
    }
    for recipe in ("accurate", "fast"):
        out[recipe] = one_recipe(recipe, args.steps, peaks)
        if args.variants:  # speed ratios: above 1 is faster than trainq's step
            out[recipe]["variants"] = variants(recipe, args.steps)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

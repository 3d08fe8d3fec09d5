"""The GPU acceptance measurements, one JSON object on stdout (bench/gpu.sh runs it).

On the full MNIST as `trainq data install mnist` places it (bench.trainer finds it), for
each batch size: training images/s of trainq's trainer in
eager mode with bf16 and with fp16 (GradScaler), and with torch.compile (CUDA graphs); the
peak memory each reached; and whether the memory figures the metrics stream reports agree
with torch.cuda.max_memory_allocated read at the same moment. The baseline in the same run
is the same trainer with foreach optimizers (trainq's CUDA default is fused). The steady
rate is the last epoch's: the first pays for cuDNN autotuning and compilation.

    python -m bench.gpu [--epochs 2] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from bench.trainer import bench_data_dir
from core.spec import JobSpec
from core.train import Callbacks, StepMetrics, train
from core.train.device import device_name


class _MemoryCheck:
    """Compares each reported block's last peak with the allocator's, read as it arrives."""

    def __init__(self) -> None:
        self.blocks = 0
        self.worst_gap = 0  # bytes the allocator's peak exceeded the reported one
        self.reported_peak = 0
        self.zero_reports = 0

    def __call__(self, points: Sequence[StepMetrics]) -> None:
        self.blocks += 1
        last = points[-1]
        self.reported_peak = max(self.reported_peak, last.memory_peak)
        self.zero_reports += sum(p.memory_allocated == 0 for p in points)
        gap = torch.cuda.max_memory_allocated() - last.memory_peak
        self.worst_gap = max(self.worst_gap, gap)


@contextmanager
def foreach_optimizers() -> Iterator[None]:
    """The baseline: the trainer's optimizers built with foreach=True instead of fused."""
    originals = torch.optim.AdamW, torch.optim.SGD

    def foreach(cls: Any) -> Any:
        def build(*args: Any, fused: bool | None = None, **kw: Any) -> Any:
            return cls(*args, **{**kw, "foreach": True})

        return build

    torch.optim.AdamW, torch.optim.SGD = foreach(originals[0]), foreach(originals[1])  # type: ignore[misc]
    try:
        yield
    finally:
        torch.optim.AdamW, torch.optim.SGD = originals  # type: ignore[misc]


def one_run(root: Path, epochs: int, foreach: bool = False, **overrides: Any) -> dict[str, Any]:
    torch.cuda.reset_peak_memory_stats()
    check = _MemoryCheck()
    t0 = time.perf_counter()
    spec = JobSpec(dataset="mnist", epochs=epochs, **overrides)
    with foreach_optimizers() if foreach else nullcontext():
        result = train(spec, data_dir=root, device="cuda", callbacks=Callbacks(on_steps=check))
    return {
        "steady_images_per_second": round(result.epochs[-1].images_per_second),
        "images_per_second": round(result.images_per_second),
        "test_accuracy": result.test_accuracy,
        "wall_s": round(time.perf_counter() - t0, 2),
        "peak_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
        "stream_peak_mib": round(check.reported_peak / 2**20, 1),
        # The stream's figure is read at the step; the allocator's at the flush after it, so
        # the allocator may be ahead by what the steps since allocated, never behind.
        "stream_vs_allocator_gap_mib": round(check.worst_gap / 2**20, 2),
        "steps_reporting_zero_memory": check.zero_reports,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.gpu needs a CUDA GPU")
    warnings.filterwarnings("ignore", category=UserWarning)
    variants: dict[str, dict[str, Any]] = {
        "bs64_bf16_foreach": {"batch_size": 64, "amp": "bf16", "foreach": True},
        "bs64_bf16": {"batch_size": 64, "amp": "bf16"},
        "bs64_fp16_foreach": {"batch_size": 64, "amp": "fp16", "foreach": True},
        "bs64_fp16": {"batch_size": 64, "amp": "fp16"},
        "bs128_bf16": {"batch_size": 128, "amp": "bf16"},
        "bs512_bf16": {"batch_size": 512, "amp": "bf16"},
        "bs512_fp16": {"batch_size": 512, "amp": "fp16"},
        "bs4096_bf16": {"batch_size": 4096, "amp": "bf16"},
        "bs4096_fp16": {"batch_size": 4096, "amp": "fp16"},
    }
    if not args.no_compile:
        for bs in (64, 512, 4096):
            variants[f"bs{bs}_bf16_compile"] = {"batch_size": bs, "amp": "bf16", "compile": True}
    out: dict[str, Any] = {
        "benchmark": "gpu",
        "device": device_name(torch.device("cuda")),
        "torch": torch.__version__,
        "epochs": args.epochs,
        "results": {},
    }
    root = bench_data_dir()
    for key, kw in variants.items():
        try:
            out["results"][key] = one_run(root, args.epochs, **kw)
        except Exception as e:  # one failing variant must not hide the others
            out["results"][key] = {"error": f"{type(e).__name__}: {e}"[:500]}
    base = out["results"].get("bs64_bf16_foreach", {}).get("steady_images_per_second")
    if base:
        out["steady_speedup_vs_bs64_bf16_foreach"] = {
            k: round(v["steady_images_per_second"] / base, 2)
            for k, v in out["results"].items()
            if "steady_images_per_second" in v
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""The seed article's claims, measured rather than believed. Prints one JSON object.

- "view beats flatten by 15%": time the flatten between the conv blocks and fc1 both ways
  (forward + backward, channels_last and not; view must copy first on channels_last).
- "empty_cache() each epoch prevents leaks" (CUDA only): peak and reserved memory and the
  time of an epoch after empty_cache, against the same epoch without it.
- channels_last and pool-before-ReLU, the two model-side changes trainq makes.

    python -m bench.claims [--device auto]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from core.train.device import device_name, resolve_device
from core.train.model import Net


def timed(fn: Callable[[], Any], device: torch.device, repeats: int = 7, inner: int = 20) -> float:
    """Median seconds per call, synchronised on CUDA."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer):  # type: ignore[no-untyped-def]
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def view_vs_flatten(device: torch.device, batch: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(batch, 64, 7, 7, device=device).contiguous(memory_format=fmt)
        x.requires_grad_(True)
        fc = nn.Linear(3136, 128).to(device)

        def by_view(x: torch.Tensor = x, fc: nn.Module = fc) -> None:
            # view() refuses a channels_last tensor: it needs .contiguous() (a copy) first.
            t = x.contiguous().view(x.size(0), -1)
            fc(t).sum().backward()

        def by_flatten(x: torch.Tensor = x, fc: nn.Module = fc) -> None:
            fc(torch.flatten(x, 1)).sum().backward()

        name = "channels_last" if fmt is torch.channels_last else "nchw"
        v, f = timed(by_view, device), timed(by_flatten, device)
        out[name] = {"view_us": v * 1e6, "flatten_us": f * 1e6, "view_over_flatten": v / f}
    try:
        torch.randn(2, 4, 3, 3).contiguous(memory_format=torch.channels_last).view(2, -1)
        out["view_on_channels_last_without_copy"] = "works"
    except RuntimeError as e:
        out["view_on_channels_last_without_copy"] = f"fails: {str(e).splitlines()[0]}"
    return out


def model_changes(device: torch.device, batch: int) -> dict[str, Any]:
    """Images/s of one training step: NCHW vs channels_last, ReLU-then-pool vs pool-then-ReLU."""
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    out: dict[str, Any] = {}
    for name, channels_last, pool_first in [
        ("article_order_nchw", False, False),
        ("article_order_channels_last", True, False),
        ("trainq_pool_first_channels_last", True, True),
    ]:
        torch.manual_seed(0)
        model = Net().to(device)
        if not pool_first:  # swap back to the article's conv-BN-ReLU-pool order
            for block in (model.block1, model.block2):
                block[2], block[3] = block[3], block[2]
        xi = x
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
            xi = x.contiguous(memory_format=torch.channels_last)
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        out[name] = batch / timed(train_step(model, xi, y, opt), device, inner=10)
    base = out["article_order_nchw"]
    return {
        "images_per_second": out,
        "speedup_vs_article_order_nchw": {k: v / base for k, v in out.items()},
    }


def empty_cache_per_epoch(device: torch.device, batch: int) -> dict[str, Any]:
    if device.type != "cuda":
        return {"skipped": "CUDA only: on the CPU empty_cache() does nothing"}
    model = Net().to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(batch, 1, 28, 28, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=device)
    step = train_step(model, x, y, opt)
    results = {}
    for label, clear in (("without", False), ("with", True)):
        reserved = []
        times = []
        for _epoch in range(5):
            if clear:
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            times.append(timed(step, device, repeats=1, inner=50))
            reserved.append(torch.cuda.memory_reserved())
        results[label] = {
            "reserved_bytes_per_epoch": reserved,
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            "first_steps_ms": [t * 1000 for t in times],
        }
    results["note"] = (
        "reserved memory is flat without empty_cache: the caching allocator reuses blocks, "
        "so there is no leak to prevent; empty_cache only hands them back to re-allocate"
    )
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    device = resolve_device(args.device)
    print(
        json.dumps(
            {
                "benchmark": "claims",
                "device": device_name(device),
                "batch": args.batch,
                "view_vs_flatten": view_vs_flatten(device, args.batch),
                "model_changes": model_changes(device, args.batch),
                "empty_cache_per_epoch": empty_cache_per_epoch(device, args.batch),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

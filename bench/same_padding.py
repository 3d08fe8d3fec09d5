"""EfficientNet-Lite0's training step with SAME padding as the conv's own where it is
symmetric (trainq's) against a padded copy before every conv (the baseline: F.pad copies
even a zero padding), in the same run. Prints one JSON object.

    python -m bench.same_padding [--side 96] [--batch 32] [--steps 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from core.train.pretrained import SameConv2d, efficientnet_lite0, fit_padding


def padded_copy(self: SameConv2d, x: torch.Tensor) -> torch.Tensor:
    """The baseline: every conv's input padded into a copy first."""
    return F.conv2d(
        F.pad(x, self.same), self.weight, None, self.stride, 0, self.dilation, self.groups
    )


def seconds_per_step(args: argparse.Namespace) -> float:
    torch.manual_seed(0)
    model = efficientnet_lite0(10).to(memory_format=torch.channels_last)
    fit_padding(model, (3, args.side, args.side))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(args.batch, 3, args.side, args.side).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (args.batch,))
    best = float("inf")
    for repeat in range(args.repeats + 1):  # the first warms up
        began = time.perf_counter()
        for _ in range(args.steps):
            with torch.autocast("cpu", torch.bfloat16, enabled=args.bf16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if repeat:
            best = min(best, (time.perf_counter() - began) / args.steps)
    return best


def timed(args: argparse.Namespace, forward: Callable[..., torch.Tensor] | None) -> float:
    own = SameConv2d.forward
    if forward is not None:
        SameConv2d.forward = forward  # type: ignore[method-assign]
    try:
        return seconds_per_step(args)
    finally:
        SameConv2d.forward = own  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--side", type=int, default=96)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--bf16", action="store_true", help="autocast to bf16 as amp=auto does on AVX-512 BF16"
    )
    args = p.parse_args()
    base = timed(args, padded_copy)
    ours = timed(args, None)
    out: dict[str, Any] = {
        "model": "efficientnet_lite0",
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "side": args.side,
        "batch": args.batch,
        "bf16": args.bf16,
        "baseline_padded_copy_s_per_step": round(base, 4),
        "trainq_s_per_step": round(ours, 4),
        "speedup": round(base / ours, 3),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()

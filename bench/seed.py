"""trainq's default spec against the seed article's pipeline on the full MNIST, in one run.

The seed: its CNN, ToTensor + Normalize in a DataLoader (4 workers, pinned, persistent),
batch 128, AdamW 1e-3 with a per-epoch cosine over its 10 epochs, validated after each epoch
(bench.trainer.run_article). trainq: the default JobSpec on the same 60,000 / 10,000 files.

Reported: the final test accuracy of each, and the seconds from the start to the end of the
first epoch at 99.2% (the seed's headline range is 99.2-99.4%) and in all, with ratios
(seed / trainq: above 1 is trainq faster). With --dataset fashion-mnist: what the default
spec and one tuned spec reach on Fashion-MNIST.

    python -m bench.seed [--seed-epochs 10] [--dataset fashion-mnist] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from bench.trainer import bench_data_dir, run_article, run_trainq, seconds_to
from core.spec import JobSpec
from core.train.device import device_name, resolve_device

TARGET = 0.992
# Fashion-MNIST, tuned (with 10 epochs, twice the default): twice the widths, and shifts
# without the rotation and zoom (clothes are photographed upright and at one scale).
FASHION_TUNED: dict[str, Any] = {
    "conv1_channels": 64,
    "conv2_channels": 128,
    "conv3_channels": 256,
    "hidden": 256,
    "augment": "shift",
}


def cpu_description() -> dict[str, Any]:
    """Which CPU: its model name and the flags that decide the fast paths here."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return {
        "model": name,
        "flags": [f for f in wanted if f in flags],
        "threads": torch.get_num_threads(),
    }


def summary(run: dict[str, Any]) -> dict[str, Any]:
    seen = run["epochs_seen"]
    return {
        "test_accuracy": run["test_accuracy"],
        "epochs": len(seen),
        "seconds": seen[-1][0],
        "seconds_to_99.2": seconds_to(TARGET, seen),
        "accuracy_by_epoch": [round(acc, 4) for _, acc in seen],
        "images_per_second": run["images_per_second"],
        **({"amp": run["amp"]} if "amp" in run else {}),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed-epochs", type=int, default=10, help="the article trains 10")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dataset", choices=["mnist", "fashion-mnist"], default="mnist")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)  # pin_memory without a GPU
    device = resolve_device(args.device)
    root = bench_data_dir()
    out: dict[str, Any] = {
        "benchmark": "seed",
        "device": device_name(device),
        "cpu": cpu_description(),
    }
    if args.dataset == "fashion-mnist":
        default = summary(run_trainq(root, None, device, dataset="fashion-mnist"))
        print(json.dumps({"fashion-mnist default_spec": default}), file=sys.stderr, flush=True)
        tuned = run_trainq(root, 10, device, dataset="fashion-mnist", **FASHION_TUNED)
        out["fashion-mnist"] = {
            "default_spec": default,
            "tuned_spec": {"spec_overrides": FASHION_TUNED, **summary(tuned)},
        }
    else:
        seed = summary(run_article(root, args.seed_epochs, device))
        ours = summary(run_trainq(root, None, device))
        out |= {
            "dataset": "mnist (60,000 train, 10,000 test)",
            "default_spec": JobSpec(dataset="mnist").model_dump(mode="json"),
            "seed": seed,
            "trainq": ours,
            "speedup_to_99.2": ratio(seed["seconds_to_99.2"], ours["seconds_to_99.2"]),
            "speedup_total": ratio(seed["seconds"], ours["seconds"]),
            "accuracy_delta": ours["test_accuracy"] - seed["test_accuracy"],
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

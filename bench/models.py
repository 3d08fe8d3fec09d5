"""Each architecture through the whole trainer on the same small photo set (patches of
scikit-image's real photos, tests/photos.py): training images per second, parameters and
the step-memory estimate the API bounds jobs by. Prints one JSON object.

    python -m bench.models [--device auto] [--side 32] [--steps 20] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from core.model_sizes import parameter_count, step_memory
from core.spec import Architecture, JobSpec
from core.train import train
from core.train.device import device_name, resolve_device
from tests.photos import write_photo_set


def one(arch: Architecture, data_dir: Path, name: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = JobSpec(
        dataset=name, model=arch, epochs=1, batch_size=args.batch, max_steps=args.steps,
        augment="photo", export=["torchscript"],
    )  # fmt: skip
    result = train(spec, data_dir=data_dir, device=args.device)
    shape = (3, args.side, args.side)
    row: dict[str, Any] = {
        "parameters": parameter_count(spec, shape, 4),
        "images_per_second": round(result.images_per_second, 1),
        "test_accuracy": result.test_accuracy,
    }
    if arch is not Architecture.cnn:
        row["step_memory_estimate_mib"] = round(step_memory(spec, shape, 4) / 2**20)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="auto")
    p.add_argument("--side", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        data_dir = Path(folder)
        name = write_photo_set(data_dir, side=args.side, per_class=args.batch * 2)
        rows = {a.value: one(a, data_dir, name, args) for a in Architecture}
    out = {
        "device": device_name(resolve_device(args.device)),
        "images": f"3x{args.side}x{args.side}, 4 classes, batch {args.batch}",
        "steps": args.steps,
        "models": rows,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

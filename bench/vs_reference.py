"""trainq against torchvision's reference classification script on the same class-folder set
and the same network, in one run: images/s and the time to a fixed accuracy.

The set: Fashion-MNIST's real garments (10 classes; `trainq data install fashion-mnist`),
each resized from 28 to 32 px with anti-aliasing and coloured (the garment in one random
colour on a background of another), saved as PNG in train/<class>/ and val/<class>/ folders:
`--max-images` training images (the first of each class in Fashion-MNIST's train split) and
a quarter as many to validate (from its test split).

trainq takes the folder as POST /datasets does (the zip through api.uploads.parse_upload,
image_size 32) and trains it in-process (core.train.train) with its default spec but
`model` and `augment: photo`. The reference (pytorch/vision's references/classification/
train.py, never part of this repository: `git clone --depth 1
https://github.com/pytorch/vision`, then pass `--reference vision/references/classification`)
runs as a subprocess through bench.reference_shim, which registers trainq's networks by name,
so both train the same network; it gets the same optimiser, learning rate, weight decay,
cosine schedule, label smoothing and batch, its own RandomResizedCrop + flip at 32 px,
`-j 2` loader workers and fp32 (its --amp is CUDA only). Both clocks start before the
set is read (trainq's includes decoding the upload; the reference's its process start).

    python -m bench.vs_reference --reference DIR [--epochs 8] [--max-images 2000]
        [--target 0.5] [--models cnn,resnet18] [--stock]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.datasets import FashionMNIST

from api.photo_sets import PhotoOptions
from api.uploads import parse_upload
from bench.reference_shim import EPOCH_LINE
from bench.seed import cpu_description
from bench.trainer import seconds_to
from core.spec import JobSpec
from core.train import Callbacks, train
from core.train.data import user_dataset_path
from tests.service import DATASETS_CACHE

SIDE = 32
RECIPE = {"batch_size": 64, "lr": 1e-3, "weight_decay": 1e-4, "label_smoothing": 0.1}


def coloured(garments: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(N, SIDE, SIDE, 3) uint8: each 28 px garment resized to SIDE and laid, in one random
    colour, over a background of another."""
    g = torch.from_numpy(garments)[:, None].float() / 255
    alpha = F.interpolate(g, size=(SIDE, SIDE), mode="bilinear", antialias=True).clamp(0, 1)
    alpha = alpha.permute(0, 2, 3, 1).numpy()  # (N, SIDE, SIDE, 1)
    fg = rng.uniform(0, 255, (len(garments), 1, 1, 3))
    bg = rng.uniform(0, 255, (len(garments), 1, 1, 3))
    return (alpha * fg + (1 - alpha) * bg).round().clip(0, 255).astype(np.uint8)


def write_folders(root: Path, train_images: int, seed: int = 0) -> dict[str, Any]:
    """train/<class>/*.png and val/<class>/*.png under `root`; what was written."""
    per_class = {"train": train_images // 10, "val": max(1, train_images // 40)}
    rng = np.random.default_rng(seed)
    for split, n in per_class.items():
        fashion = FashionMNIST(str(DATASETS_CACHE), train=split == "train", download=False)
        labels = fashion.targets.numpy()
        for c, name in enumerate(fashion.classes):
            chosen = np.flatnonzero(labels == c)[:n]
            folder = root / split / name.replace("/", "-")
            folder.mkdir(parents=True)
            for i, image in enumerate(coloured(fashion.data.numpy()[chosen], rng)):
                Image.fromarray(image).save(folder / f"{i:05d}.png")
    return {
        "source": "Fashion-MNIST (real garments), 10 classes, resized 28 to 32 px with "
        "anti-aliasing, each in a random colour on a random background colour, PNG",
        "train_images": per_class["train"] * 10,
        "val_images": per_class["val"] * 10,
    }


def zipped(root: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for path in sorted(root.rglob("*.png")):
            zf.write(path, path.relative_to(root).as_posix())
    return buf.getvalue()


def run_trainq(folder: Path, model: str, epochs: int, data_dir: Path) -> dict[str, Any]:
    """The folder through the upload path and trainq's trainer; times from before the upload
    is read."""
    archive = zipped(folder)
    started = time.perf_counter()
    parsed = parse_upload(archive, options=PhotoOptions(image_size=SIDE))
    name = f"ds:{uuid.uuid4()}"
    path = user_dataset_path(name, data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(parsed.npz)
    upload_seconds = time.perf_counter() - started
    seen: list[tuple[float, float]] = []
    cb = Callbacks(on_epoch=lambda m: seen.append((time.perf_counter() - started, m.test_accuracy)))
    spec = JobSpec(dataset=name, model=model, augment="photo", epochs=epochs, **RECIPE)
    result = train(spec, data_dir=data_dir, device="cpu", callbacks=cb)
    return {
        "amp": result.record["amp_resolved"],
        "upload_seconds": upload_seconds,
        "images_per_second": result.images_per_second,
        "epochs_seen": seen,
        "whole_run_seconds": time.perf_counter() - started,  # with the model's export
    }


def run_reference(reference: Path, folder: Path, model: str, epochs: int) -> dict[str, Any]:
    """The reference script on the folder (bench.reference_shim); times from its start. Its
    checkpoints go beside the folder, into the bench's temporary directory."""
    out = tempfile.mkdtemp(prefix="reference-", dir=folder.parent)
    argv = [
        sys.executable, "-m", "bench.reference_shim", str(reference),
        "--data-path", str(folder), "--model", model, "--device", "cpu", "-j", "2",
        "--epochs", str(epochs), "-b", str(RECIPE["batch_size"]), "--opt", "adamw",
        "--lr", str(RECIPE["lr"]), "--wd", str(RECIPE["weight_decay"]),
        "--label-smoothing", str(RECIPE["label_smoothing"]),
        "--lr-scheduler", "cosineannealinglr", "--train-crop-size", str(SIDE),
        "--val-resize-size", str(SIDE), "--val-crop-size", str(SIDE),
        "--output-dir", out, "--print-freq", "1000",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    started = time.perf_counter()
    seen: list[tuple[float, float]] = []
    epochs_out: list[dict[str, Any]] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(EPOCH_LINE):
                epoch = json.loads(line[len(EPOCH_LINE) :])
                seen.append((time.perf_counter() - started, epoch["accuracy"]))
                epochs_out.append(epoch)
    if proc.returncode != 0 or not epochs_out:
        raise SystemExit(f"bench: the reference script failed ({proc.returncode}): {argv}")
    return {
        "images_per_second": sum(e["images"] for e in epochs_out)
        / sum(e["seconds"] for e in epochs_out),
        "epochs_seen": seen,
        "whole_run_seconds": time.perf_counter() - started,
    }


def summary(run: dict[str, Any], target: float) -> dict[str, Any]:
    seen = run.pop("epochs_seen")
    return {
        **run,
        "accuracy_by_epoch": [round(acc, 4) for _, acc in seen],
        "seconds_by_epoch": [round(t, 1) for t, _ in seen],
        f"seconds_to_{target}": seconds_to(target, seen),
    }


def sooner(ours: dict[str, Any], theirs: dict[str, Any], accuracy: float) -> float | None:
    """The reference's seconds to `accuracy` over trainq's (above 1: trainq sooner)."""
    a, b = (
        seconds_to(accuracy, list(zip(r["seconds_by_epoch"], r["accuracy_by_epoch"], strict=True)))
        for r in (theirs, ours)
    )
    return None if a is None or b is None else a / b


def compare(ours: dict[str, Any], theirs: dict[str, Any], target: float) -> dict[str, Any]:
    """Ratios, trainq over the reference: images/s, and how much sooner each reaches the
    fixed target and the best accuracy the reference reached in its epochs."""
    best = max(theirs["accuracy_by_epoch"])
    return {
        "trainq": ours,
        "reference": theirs,
        "images_per_second_ratio": ours["images_per_second"] / theirs["images_per_second"],
        "sooner_to_target": sooner(ours, theirs, target),
        "reference_best_accuracy": best,
        "sooner_to_reference_best": sooner(ours, theirs, best),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reference",
        type=Path,
        required=True,
        help="pytorch/vision's references/classification folder (git clone --depth 1 "
        "https://github.com/pytorch/vision)",
    )
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--max-images", type=int, default=2000, help="training images")
    parser.add_argument("--target", type=float, default=0.5, help="the fixed accuracy")
    parser.add_argument("--models", default="cnn,resnet18")
    parser.add_argument("--stock", action="store_true", help="also torchvision's resnet18")
    args = parser.parse_args()
    if not (args.reference / "train.py").is_file():
        raise SystemExit(f"bench: no train.py in {args.reference}: see --help")
    with tempfile.TemporaryDirectory() as tmp:
        folder, data_dir = Path(tmp) / "set", Path(tmp) / "data"
        out: dict[str, Any] = {
            "benchmark": "vs_reference",
            "cpu": cpu_description(),
            "set": write_folders(folder, args.max_images),
            "epochs": args.epochs,
            "recipe": RECIPE,
            "target_accuracy": args.target,
        }
        for model in args.models.split(","):
            ours = summary(run_trainq(folder, model, args.epochs, data_dir), args.target)
            ref = run_reference(args.reference, folder, f"trainq_{model}", args.epochs)
            out[model] = compare(ours, summary(ref, args.target), args.target)
            print(json.dumps({model: out[model]}), file=sys.stderr, flush=True)
        if args.stock:
            stock = run_reference(args.reference, folder, "resnet18", args.epochs)
            out["reference_stock_resnet18"] = summary(stock, args.target)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

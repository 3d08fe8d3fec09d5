"""Fine-tuning EfficientNet-Lite0 from its ImageNet weights against training it from scratch,
on 100 images per class of a photo-like set, accuracy after the same epochs (docs/models.md).

The set: Fashion-MNIST's real garments (10 classes), scaled to 9/16 to 7/8 of the side, each
tinted a random colour and laid over a random crop (48×48 by default) of one of
scikit-image's real photos,
at a random place; 100 per class to train (from Fashion-MNIST's train split), 50 per class
to test (from its test split, on crops of other photos than the training backgrounds).

Runs on the same data, batch, epochs and seed, chosen by --modes: this file's own loop from
scratch (AdamW at --lr), fine-tuned (the head at --lr, the backbone at --backbone-scale of
it), and the backbone frozen (the head alone); and trainq jobs, `trainq-scratch` and
`trainq-pretrained` (`pretrained: true`, `lr` and `backbone_lr_scale` as above): the set as
a class-folder zip of PNGs through the upload's parse, then the trainer as a worker runs it
(`augment: photo`, the rest of the spec its defaults), tested on the same 500 images.

    python -m bench.pretrained [--epochs 3] [--size 48] [--modes scratch,finetune,frozen]
        [--lr 1e-3] [--backbone-scale 0.1]
"""

from __future__ import annotations

import argparse
import io
import json
import os
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
from skimage import data
from torchvision.datasets import FashionMNIST

from api.photo_sets import PhotoOptions
from api.uploads import parse_upload
from bench.seed import cpu_description
from core.spec import JobSpec
from core.train import Callbacks, train
from core.train.data import user_dataset_path
from core.train.pretrained import (
    MEAN,
    STD,
    backbone_parameters,
    efficientnet_lite0,
    head_parameters,
)
from tests.service import DATASETS_CACHE

TRAIN_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry")
TEST_PHOTOS = ("hubble_deep_field", "retina", "colorwheel", "logo", "coins")
TRAIN_PER_CLASS, TEST_PER_CLASS = 100, 50


def composite(
    garments: np.ndarray, photos: list[np.ndarray], size: int, rng: np.random.Generator
) -> np.ndarray:
    """(N, size, size, 3) uint8: each garment tinted and laid over a random photo crop."""
    out = np.empty((len(garments), size, size, 3), np.uint8)
    for i, garment in enumerate(garments):
        photo = photos[rng.integers(len(photos))]
        y, x = rng.integers(photo.shape[0] - size), rng.integers(photo.shape[1] - size)
        background = photo[y : y + size, x : x + size].astype(np.float32)
        side = int(rng.integers(size * 9 // 16, size * 7 // 8 + 1))
        g = torch.from_numpy(garment)[None, None].float()
        alpha = F.interpolate(g, size=(side, side), mode="bilinear", antialias=True)[0, 0]
        alpha = (alpha / 255).numpy()[..., None]  # (side, side, 1)
        tint = rng.uniform(40, 255, 3).astype(np.float32)
        top, left = rng.integers(size - side + 1), rng.integers(size - side + 1)
        patch = background[top : top + side, left : left + side]
        background[top : top + side, left : left + side] = alpha * tint + (1 - alpha) * patch
        out[i] = background.clip(0, 255).astype(np.uint8)
    return out


def photos(names: tuple[str, ...]) -> list[np.ndarray]:
    """scikit-image's photos as RGB uint8 (gray ones repeated, alpha dropped)."""
    out = []
    for name in names:
        image = getattr(data, name)()
        image = np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image[..., :3]
        out.append(image)
    return out


def split(train: bool, per_class: int, names: tuple[str, ...], size: int, seed: int) -> Any:
    """The first `per_class` garments of each class of a Fashion-MNIST split, composited:
    (N, size, size, 3) uint8 images and their labels."""
    fashion = FashionMNIST(str(DATASETS_CACHE), train=train, download=False)
    labels = fashion.targets.numpy()
    chosen = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in range(10)])
    rng = np.random.default_rng(seed)
    return composite(fashion.data.numpy()[chosen], photos(names), size, rng), labels[chosen]


def normalised(images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """As the weights were trained: (x·255 − 127) / 128, for every run of the bench's own."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    x = (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    return x, torch.from_numpy(labels).long()


def run(mode: str, train: Any, test: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Train one model `mode` (scratch, finetune, frozen) at `args.lr` (the backbone's, when
    fine-tuned, times `args.backbone_scale`); test accuracy after each epoch."""
    epochs, batch = args.epochs, args.batch
    torch.manual_seed(0)
    model = efficientnet_lite0(10, 3, pretrained=mode != "scratch")
    head = list(head_parameters(model))
    backbone = list(backbone_parameters(model))
    groups = [{"params": head, "lr": args.lr}]
    if mode == "scratch":
        groups[0]["params"] = head + backbone
    elif mode == "finetune":
        groups.append({"params": backbone, "lr": args.lr * args.backbone_scale})
    else:
        for p in backbone:
            p.requires_grad_(False)
    optimizer = torch.optim.AdamW(groups, weight_decay=1e-4)
    x, y = train
    accuracies, start = [], time.perf_counter()
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x)).split(batch):
            xb = x[idx].flip(3) if torch.rand(()) < 0.5 else x[idx]  # garments are symmetric
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), y[idx]).backward()
            optimizer.step()
        accuracies.append(round(accuracy(model, *test), 4))
        print(f"{mode} epoch {len(accuracies)}: {accuracies[-1]}", file=sys.stderr, flush=True)
    return {"test_accuracy_per_epoch": accuracies, "seconds": round(time.perf_counter() - start)}


def zipped_folders(sets: dict[str, Any]) -> bytes:
    """<split>/<class>/<k>.png for each split of `sets` ("train", "val"), as an upload is."""
    buf = io.BytesIO()
    classes = FashionMNIST.classes
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for split_name, (images, labels) in sets.items():
            for k, (image, label) in enumerate(zip(images, labels, strict=True)):
                png = io.BytesIO()
                Image.fromarray(image).save(png, format="PNG")
                folder = classes[label].replace("/", "-")
                zf.writestr(f"{split_name}/{folder}/{k:05d}.png", png.getvalue())
    return buf.getvalue()


def run_trainq(mode: str, archive: bytes, args: argparse.Namespace) -> dict[str, Any]:
    """One trainq job (`trainq-scratch` or `trainq-pretrained`) on the zipped set, its `lr`
    and `backbone_lr_scale` from `args`: test accuracy after each epoch, as the job reports."""
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        parsed = parse_upload(archive, options=PhotoOptions(image_size=args.size))
        name = f"ds:{uuid.uuid4()}"
        path = user_dataset_path(name, data_dir)
        path.parent.mkdir(parents=True)
        path.write_bytes(parsed.npz)
        pretrained = mode == "trainq-pretrained"
        spec = JobSpec(
            dataset=name, model="efficientnet_lite0", pretrained=pretrained, epochs=args.epochs,
            batch_size=args.batch, augment="photo", export=["torchscript"], lr=args.lr,
            backbone_lr_scale=args.backbone_scale if pretrained else 1.0,
        )  # fmt: skip
        accuracies: list[float] = []

        def epoch_done(m: Any) -> None:
            accuracies.append(round(m.test_accuracy, 4))
            print(f"{mode} epoch {m.epoch}: {accuracies[-1]}", file=sys.stderr, flush=True)

        start = time.perf_counter()
        result = train(
            spec, data_dir=data_dir, device="cpu", callbacks=Callbacks(on_epoch=epoch_done)
        )
    return {
        "test_accuracy_per_epoch": accuracies,
        "seconds": round(time.perf_counter() - start),
        "amp": result.record["amp_resolved"],
        "normalized_by": result.record["preprocessing"]["normalized_by"],
    }


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    predicted = torch.cat([model(xb).argmax(1) for xb in x.split(250)])
    return float((predicted == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--size", type=int, default=48)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--modes", default="scratch,finetune,frozen", help="comma-separated")
    parser.add_argument("--lr", type=float, default=1e-3, help="the head's; all of scratch's")
    parser.add_argument("--backbone-scale", type=float, default=0.1, help="fine-tuned: × lr")
    args = parser.parse_args()
    load_before = os.getloadavg()
    train_set = split(True, TRAIN_PER_CLASS, TRAIN_PHOTOS, args.size, seed=1)
    test_set = split(False, TEST_PER_CLASS, TEST_PHOTOS, args.size, seed=2)
    train, test = normalised(*train_set), normalised(*test_set)
    archive = zipped_folders({"train": train_set, "val": test_set})
    results: dict[str, dict[str, Any]] = {}
    for m in args.modes.split(","):
        if m.startswith("trainq-"):
            results[m] = run_trainq(m, archive, args)
        else:
            results[m] = run(m, train, test, args)
    for m, baseline in (("finetune", "scratch"), ("frozen", "scratch"),
                        ("trainq-pretrained", "trainq-scratch")):  # fmt: skip
        if m in results and baseline in results:  # final accuracy against the baseline's
            final = results[m]["test_accuracy_per_epoch"][-1]
            base = results[baseline]["test_accuracy_per_epoch"][-1]
            results[m][f"final_vs_{baseline}"] = round(final / max(base, 1e-9), 2)
    print(
        json.dumps(
            {
                "set": f"fashion-mnist on skimage photos, {args.size}px, 10 classes, "
                f"{TRAIN_PER_CLASS}/{TEST_PER_CLASS} per class",
                "epochs": args.epochs,
                "batch": args.batch,
                "lr": args.lr,
                "backbone_scale": args.backbone_scale,
                "cpu": cpu_description(),
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
                **results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

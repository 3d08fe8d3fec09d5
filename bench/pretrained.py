"""Fine-tuning EfficientNet-Lite0 from its ImageNet weights against training it from scratch,
on 100 images per class of a photo-like set, accuracy after the same epochs (docs/models.md).

The set: Fashion-MNIST's real garments (10 classes), scaled to 9/16 to 7/8 of the side, each
tinted a random colour and laid over a random crop (48×48 by default) of one of
scikit-image's real photos,
at a random place; 100 per class to train (from Fashion-MNIST's train split), 50 per class
to test (from its test split, on crops of other photos than the training backgrounds).

Three runs, same data, batch, epochs and seed: from scratch (AdamW 1e-3), fine-tuned
(backbone at a tenth of the head's 1e-3), and the backbone frozen (the head alone).

    python -m bench.pretrained [--epochs 3] [--size 48]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from skimage import data
from torchvision.datasets import FashionMNIST

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
    """The first `per_class` garments of each class of a Fashion-MNIST split, composited."""
    fashion = FashionMNIST(str(DATASETS_CACHE), train=train, download=False)
    labels = fashion.targets.numpy()
    chosen = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in range(10)])
    rng = np.random.default_rng(seed)
    images = composite(fashion.data.numpy()[chosen], photos(names), size, rng)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    x = (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    return x, torch.from_numpy(labels[chosen]).long()


def run(mode: str, train: Any, test: Any, epochs: int, batch: int) -> dict[str, Any]:
    """Train one model `mode` (scratch, finetune, frozen); test accuracy after each epoch."""
    torch.manual_seed(0)
    model = efficientnet_lite0(10, 3, pretrained=mode != "scratch")
    head = list(head_parameters(model))
    backbone = list(backbone_parameters(model))
    groups = [{"params": head, "lr": 1e-3}]
    if mode == "scratch":
        groups[0]["params"] = head + backbone
    elif mode == "finetune":
        groups.append({"params": backbone, "lr": 1e-4})
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
    args = parser.parse_args()
    train = split(True, TRAIN_PER_CLASS, TRAIN_PHOTOS, args.size, seed=1)
    test = split(False, TEST_PER_CLASS, TEST_PHOTOS, args.size, seed=2)
    results = {m: run(m, train, test, args.epochs, args.batch) for m in ("scratch", "finetune")}
    results["frozen"] = run("frozen", train, test, args.epochs, args.batch)
    print(
        json.dumps(
            {
                "set": f"fashion-mnist on skimage photos, {args.size}px, 10 classes, "
                f"{TRAIN_PER_CLASS}/{TEST_PER_CLASS} per class",
                "epochs": args.epochs,
                "cpu": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads(),
                **results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

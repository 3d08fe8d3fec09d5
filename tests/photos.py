"""A small photo set for tests: patches of scikit-image's real photos (an astronaut, a cup of
coffee, a cat, a rocket), one class a photo, written as an uploaded set's canonical .npz."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import skimage.data
import torch
import torch.nn.functional as F

from core.train.data import user_dataset_path

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")


def photo_patches(side: int, per_class: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3, side, side) uint8 patches, each a random 64 px square of one photo downsized
    to `side` with anti-aliasing, and their labels (the photo's number)."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for k, name in enumerate(PHOTOS):
        photo = getattr(skimage.data, name)()  # (H, W, 3) uint8
        h, w = photo.shape[:2]
        for _ in range(per_class):
            y, x = rng.integers(0, h - 64), rng.integers(0, w - 64)
            images.append(photo[y : y + 64, x : x + 64].transpose(2, 0, 1))
            labels.append(k)
    big = torch.from_numpy(np.stack(images)).float()
    small = F.interpolate(big, size=(side, side), mode="area").round().clamp(0, 255)
    return small.to(torch.uint8).numpy(), np.array(labels, dtype=np.int64)


def write_photo_set(data_dir: Path, side: int = 16, per_class: int = 16) -> str:
    """A "ds:<id>" set of photo patches in `data_dir`, 4 classes: its name."""
    name = f"ds:{uuid.uuid4()}"
    path = user_dataset_path(name, data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    x_train, y_train = photo_patches(side, per_class, seed=0)
    x_test, y_test = photo_patches(side, max(2, per_class // 4), seed=1)
    np.savez(
        path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
        num_classes=np.array(len(PHOTOS)),
    )  # fmt: skip
    return name

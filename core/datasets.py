"""User data sets: the canonical form the trainer reads, an .npz of uint8 images
(N, C, H, W) and int64 labels, train and test, and the checks every upload passes on its way
there (api.uploads reads the upload forms: an .npz, a zip of one folder of images per
class, or a zip of the four MNIST IDX files).

The limits hold for every form: zip members are counted and sized before anything is
decompressed, nothing may expand more than MAX_RATIO times, paths are checked, and a set
that nothing can be learnt from is refused.
See docs/datasets.md ("Uploading your own")."""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from core.errors import DatasetTooLarge, InvalidDataset

MAX_UPLOAD_BYTES = 200 << 20  # the body of POST /datasets
MAX_UNCOMPRESSED_BYTES = 1 << 30  # a zip's members, all together; also the pixels stored
MAX_MEMBERS = 300_000
MAX_RATIO = 100  # expanded / compressed bytes, past RATIO_FLOOR: members, .gz, pixels
RATIO_FLOOR = 1 << 20
MAX_IMAGES = 200_000
# The zip methods read: deflate inflates at most what is asked of it; bzip2 and lzma expand
# a whole block whatever was asked (a zip's directory may lie about the size).
READ_COMPRESSIONS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
_METHODS = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma", 93: "zstd", 9: "deflate64"}
MAX_SIDE = 256
MIN_SIDE = 4  # two 2×2 poolings
MIN_CLASSES, MAX_CLASSES = 2, 1000
SPLIT_SEED = 0
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
IDX_NAMES = {
    "train-images-idx3-ubyte": "x_train",
    "train-labels-idx1-ubyte": "y_train",
    "t10k-images-idx3-ubyte": "x_test",
    "t10k-labels-idx1-ubyte": "y_test",
}

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ParsedDataset:
    """The canonical .npz and what is known about it."""

    npz: bytes
    sha256: str  # of `npz`
    image_shape: tuple[int, int, int]  # C, H, W
    num_classes: int
    train_count: int
    test_count: int
    classes: tuple[str, ...] | None  # folder names, for a folder-per-class zip
    mean: tuple[float, ...] = ()  # per channel, of the train pixels in [0, 1]
    std: tuple[float, ...] = ()
    class_counts: dict[str, list[int]] | None = None  # per split ("train", "val", "holdout")
    holdout_count: int = 0  # a third split kept apart (an archive's test/ folder)
    preprocessing: dict[str, Any] | None = None  # photos: image_size, fit, channels, notes
    skipped: list[dict[str, str]] | None = None  # photos: {file, reason}
    thumbnails: list[list[str]] | None = None  # photos: base64 PNGs, a few per class


def checked_members(zf: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    """The zip's files that matter, after the zip-bomb and path guards: at most MAX_MEMBERS
    entries and MAX_UNCOMPRESSED_BYTES in all, no member compressed more than MAX_RATIO
    times, no absolute path or `..`; directories, `__MACOSX/` and dotfiles are skipped."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise DatasetTooLarge(f"the zip has {len(infos)} members: at most {MAX_MEMBERS}")
    total = sum(i.file_size for i in infos)
    if total > MAX_UNCOMPRESSED_BYTES:
        raise DatasetTooLarge(
            f"the zip holds {total} bytes uncompressed: at most {MAX_UNCOMPRESSED_BYTES} (1 GiB)"
        )
    # Entries that share their compressed data (overlapping, or one named many times) each
    # pass their own ratio; all of them together must pass it against the zip's own size.
    check_ratio(total, _zip_size(zf), "the zip")
    out = []
    for info in infos:
        name = info.filename
        parts = name.replace("\\", "/").split("/")
        if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in parts:
            raise InvalidDataset(f"zip member {name!r}: absolute paths and '..' are refused")
        if info.compress_type not in READ_COMPRESSIONS:
            raise InvalidDataset(
                f"zip member {name!r} is compressed with method {info.compress_type} "
                f"({_METHODS.get(info.compress_type, 'unknown')}): trainq reads stored and "
                "deflate members only (zip's default); zip it again without another method"
            )
        check_ratio(info.file_size, info.compress_size, f"zip member {name!r}")
        if info.is_dir() or parts[0] == "__MACOSX" or any(p.startswith(".") for p in parts):
            continue
        out.append(info)
    return out


def _zip_size(zf: zipfile.ZipFile) -> int:
    """The bytes of the zip file itself."""
    assert zf.fp is not None  # open: its directory was just read
    return zf.fp.seek(0, io.SEEK_END)


def check_ratio(expanded: int, packed: int, what: str) -> None:
    """The zip-bomb guard, for zip members, gzipped IDX files and decoded pixels alike:
    past RATIO_FLOOR, nothing may hold more than MAX_RATIO times the bytes it came from.
    Real images and labels compress a few times; only near-constant data compresses more,
    and such data is refused anyway (see _check_learnable)."""
    if expanded > RATIO_FLOOR and expanded > MAX_RATIO * max(packed, 1):
        raise DatasetTooLarge(
            f"{what} expands {expanded // max(packed, 1)} times: at most {MAX_RATIO} (a zip bomb?)"
        )


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """A member's bytes, never more than its declared size (a lying header is refused)."""
    with zf.open(info) as f:
        data = f.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise InvalidDataset(f"zip member {info.filename!r} is not the size its header says")
    return data


def stratified_split(
    labels: I64, fraction: float, seed: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Per class, a seeded shuffle cut at `fraction`: the same upload, the same split."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for k in np.unique(labels):
        idx = np.flatnonzero(labels == k)
        idx = idx[rng.permutation(len(idx))]
        cut = round(len(idx) * fraction)
        train.append(idx[:cut])
        test.append(idx[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


# ---------------------------------------------------------------------------- canonical


def check_classes(n: int) -> None:
    if not MIN_CLASSES <= n <= MAX_CLASSES:
        raise InvalidDataset(f"{n} classes: a data set needs {MIN_CLASSES} to {MAX_CLASSES}")


def _check_learnable(x_train: U8, y_train: I64) -> None:
    """Refuse a training set that nothing can be learnt from: one value everywhere (a
    standard deviation of 0, which normalisation divides by), one image repeated, or one
    class only."""
    low, high = int(x_train.min()), int(x_train.max())
    if low == high:
        raise InvalidDataset(
            f"every pixel of every x_train image is {low} (a standard deviation of 0): "
            "there is nothing to learn from"
        )
    if np.array_equal(x_train.min(axis=0), x_train.max(axis=0)):
        raise InvalidDataset(
            f"all {len(x_train)} x_train images are the same image: there is nothing to learn from"
        )
    present = np.unique(y_train)
    if len(present) < 2:
        raise InvalidDataset(
            f"every y_train label is {int(present[0])}: training needs at least 2 classes "
            "among the train labels"
        )


def canonical(
    x_train: U8,
    y_train: I64,
    x_test: U8,
    y_test: I64,
    classes: tuple[str, ...] | None = None,
    holdout: tuple[U8, I64] | None = None,
    fit: str | None = None,
) -> ParsedDataset:
    """Check the four arrays together (and a holdout split, kept apart) and write the
    canonical .npz, with the per-channel `mean` and `std` of the train pixels and, for a
    set of photos, the `fit` they were resized by (which predict applies again)."""
    c, h, w = _image_shape(x_train, y_train, x_test, y_test)
    num_classes = _class_count(y_train, y_test)
    _check_learnable(x_train, y_train)
    mean, std = channel_stats(x_train)
    extra: dict[str, Any] = {"mean": np.array(mean), "std": np.array(std)}
    if classes is not None:
        extra["classes"] = np.array(classes, dtype=str)
    if fit is not None:
        extra["fit"] = np.array(fit, dtype=str)
    counts = {"train": _counts(y_train, num_classes), "val": _counts(y_test, num_classes)}
    if holdout is not None:
        extra.update(x_holdout=_holdout_images(holdout, (c, h, w)), y_holdout=holdout[1])
        counts["holdout"] = _counts(_holdout_labels(holdout[1], num_classes), num_classes)
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        x_train=np.ascontiguousarray(x_train, dtype=np.uint8),
        y_train=y_train.astype(np.int64),
        x_test=np.ascontiguousarray(x_test, dtype=np.uint8),
        y_test=y_test.astype(np.int64),
        num_classes=np.int64(num_classes),
        **extra,
    )
    blob = buf.getvalue()
    return ParsedDataset(
        npz=blob,
        sha256=hashlib.sha256(blob).hexdigest(),
        image_shape=(c, h, w),
        num_classes=num_classes,
        train_count=len(y_train),
        test_count=len(y_test),
        classes=classes,
        mean=mean,
        std=std,
        class_counts=counts,
        holdout_count=0 if holdout is None else len(holdout[1]),
    )


def channel_stats(x: U8, chunk: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per channel, the mean and standard deviation of (N, C, H, W) uint8 pixels in [0, 1]
    units: each channel's 256 grey levels counted a chunk of images at a time (never a copy
    of the whole set), so the figures are exact whatever the order and use no torch (the RQ
    worker reads sets between its jobs' forks: core.train.kept_data)."""
    levels = np.arange(256, dtype=np.float64)
    mean, std = [], []
    for c in range(x.shape[1]):
        counts = np.zeros(256, dtype=np.int64)
        for i in range(0, len(x), chunk):
            counts += np.bincount(x[i : i + chunk, c].ravel(), minlength=256)
        n = max(1, int(counts.sum()))
        m = float(counts @ levels) / n
        mean.append(m / 255)
        std.append(float(np.sqrt(counts @ np.square(levels - m) / n)) / 255)
    return tuple(mean), tuple(std)


def _counts(y: I64, k: int) -> list[int]:
    return [int(n) for n in np.bincount(y, minlength=k)[:k]]


def _holdout_images(holdout: tuple[U8, I64], shape: tuple[int, int, int]) -> U8:
    x, y = holdout
    if x.shape[1:] != shape or len(x) != len(y):
        raise InvalidDataset(f"the holdout images are {list(x.shape[1:])}: expected {list(shape)}")
    return np.ascontiguousarray(x, dtype=np.uint8)


def _holdout_labels(y: I64, k: int) -> I64:
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= k):
        raise InvalidDataset(f"holdout labels must be class numbers 0 to {k - 1}")
    return y


def _image_shape(x_train: U8, y_train: I64, x_test: U8, y_test: I64) -> tuple[int, int, int]:
    """(C, H, W), once each set has a label per image, both sets the same shape, and the
    counts and sides are in bounds."""
    for xk, x, yk, y in (("x_train", x_train, "y_train", y_train),
                         ("x_test", x_test, "y_test", y_test)):  # fmt: skip
        if len(x) != len(y):
            raise InvalidDataset(f"{xk} has {len(x)} images but {yk} {len(y)} labels")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise InvalidDataset(
            f"x_train images are {list(x_train.shape[1:])} (C, H, W) but x_test "
            f"{list(x_test.shape[1:])}: both must be the same"
        )
    c, h, w = (int(n) for n in x_train.shape[1:])
    if not (MIN_SIDE <= h <= MAX_SIDE and MIN_SIDE <= w <= MAX_SIDE):
        raise InvalidDataset(f"images are {h}×{w}: each side must be {MIN_SIDE} to {MAX_SIDE}")
    n_train, n_test = len(y_train), len(y_test)
    if n_train + n_test > MAX_IMAGES:
        raise DatasetTooLarge(f"{n_train + n_test} images: at most {MAX_IMAGES}")
    if n_train < 2 or n_test < 1:
        raise InvalidDataset(
            f"{n_train} train and {n_test} test images: at least 2 train and 1 test"
        )
    return c, h, w


def _class_count(y_train: I64, y_test: I64) -> int:
    """The number of classes, from the labels: 0 to num_classes - 1."""
    low = int(min(y_train.min(), y_test.min()))
    high = int(max(y_train.max(), y_test.max()))
    if low < 0 or high >= MAX_CLASSES:
        raise InvalidDataset(
            f"labels run from {low} to {high}: they must be class numbers 0 to "
            f"num_classes - 1, with at most {MAX_CLASSES} classes"
        )
    check_classes(high + 1)
    return high + 1

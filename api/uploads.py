"""Reading a data set upload: an .npz, a zip of the four MNIST IDX files (both
api.upload_arrays), or a zip of one folder of PNG/JPEG images per class (here), each into
the four arrays that core.datasets checks and stores in canonical form. Nothing here trusts
the upload. See docs/datasets.md."""

from __future__ import annotations

import io
import zipfile
from pathlib import PurePosixPath

import numpy as np
from PIL import Image

from api.images import GRAY_MODES, ImageRejected, decoded_bytes, open_image, to_channels
from api.upload_arrays import check_image_count, from_idx, from_npz, idx_key
from core.datasets import (
    I64,
    IMAGE_SUFFIXES,
    MAX_IMAGES,
    MAX_SIDE,
    MAX_UNCOMPRESSED_BYTES,
    MAX_UPLOAD_BYTES,
    MIN_SIDE,
    NPZ_KEYS,
    SPLIT_SEED,
    TRAIN_FRACTION,
    U8,
    ParsedDataset,
    canonical,
    check_classes,
    check_ratio,
    checked_members,
    read_member,
    stratified_split,
)
from core.errors import DatasetTooLarge, InvalidDataset
from core.text import PLAIN_MESSAGE, is_plain

MAX_CLASS_NAME = 200  # characters, as a data set's name


def parse_upload(data: bytes, *, max_images: int = MAX_IMAGES) -> ParsedDataset:
    """Any of the three upload forms -> the canonical data set, or InvalidDataset /
    DatasetTooLarge naming the problem. Past `max_images` images (Settings.upload_max_images,
    at most MAX_IMAGES) the upload is refused from its zip directory or its headers, before
    any image is read: the images are what an upload's work grows with."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise DatasetTooLarge(f"the upload is {len(data)} bytes: at most {MAX_UPLOAD_BYTES}")
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise InvalidDataset(
            "not an .npz or .zip file: upload an .npz (x_train, y_train, x_test, y_test), a "
            "zip of one folder of PNG/JPEG images per class, or a zip of the four MNIST IDX files"
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = checked_members(zf)
            names = {m.filename for m in members}
            if {f"{k}.npy" for k in NPZ_KEYS} & names:
                x_train, y_train, x_test, y_test = from_npz(zf, members, max_images)
                classes = None
            elif any(idx_key(m.filename) for m in members):
                x_train, y_train, x_test, y_test = from_idx(zf, members, max_images)
                classes = None
            else:
                x_train, y_train, x_test, y_test, classes = _from_folders(zf, members, max_images)
    except InvalidDataset:
        raise
    except Exception as e:  # BadZipFile, unsupported compression, encrypted members, zlib...
        raise InvalidDataset(f"the file could not be read: {type(e).__name__}: {e}") from e
    return canonical(x_train, y_train, x_test, y_test, classes)


# ---------------------------------------------------------------------------- folders


def _from_folders(
    zf: zipfile.ZipFile, members: list[zipfile.ZipInfo], max_images: int
) -> tuple[U8, I64, U8, I64, tuple[str, ...]]:
    by_class = _class_members(members)
    classes = tuple(sorted(by_class))
    check_classes(len(classes))
    count = sum(len(v) for v in by_class.values())
    check_image_count(count, max_images)
    ordered = [(k, m) for k, name in enumerate(classes)
               for m in sorted(by_class[name], key=lambda i: i.filename)]  # fmt: skip
    size, c = _folder_layout(zf, ordered)
    pixels = count * c * size[0] * size[1]
    if pixels > MAX_UNCOMPRESSED_BYTES:
        raise DatasetTooLarge(f"{count} images of {c}×{size[1]}×{size[0]}: over 1 GiB of pixels")
    check_ratio(
        pixels,
        sum(m.compress_size for m in members),
        f"{count} images of {c}×{size[1]}×{size[0]} pixels",
    )
    x = np.empty((count, size[1], size[0], c), dtype=np.uint8)
    y = np.empty(count, dtype=np.int64)
    for i, (k, m) in enumerate(ordered):
        with _open_image(zf, m) as img:
            x[i] = _pixels(img, c, size, m.filename).reshape(size[1], size[0], c)
        y[i] = k
    train, test = stratified_split(y, TRAIN_FRACTION, SPLIT_SEED)
    x = x.transpose(0, 3, 1, 2)
    return (
        np.ascontiguousarray(x[train]),
        y[train],
        np.ascontiguousarray(x[test]),
        y[test],
        classes,
    )


def _class_members(members: list[zipfile.ZipInfo]) -> dict[str, list[zipfile.ZipInfo]]:
    """The members by class (folder name), each checked to be `<class_name>/<image file>`."""
    if not members:
        raise InvalidDataset("the zip holds no files")
    paths = [PurePosixPath(m.filename.replace("\\", "/")).parts for m in members]
    # A zip of the folder that holds the class folders: drop that one top folder.
    if all(len(p) == 3 for p in paths) and len({p[0] for p in paths}) == 1:
        paths = [p[1:] for p in paths]
    by_class: dict[str, list[zipfile.ZipInfo]] = {}
    for m, p in zip(members, paths, strict=True):
        if len(p) != 2:
            raise InvalidDataset(
                f"zip member {m.filename!r}: expected <class_name>/<image file> (one folder "
                "of images per class), or the four MNIST IDX files, or an .npz"
            )
        if not p[1].lower().endswith(IMAGE_SUFFIXES):
            raise InvalidDataset(f"zip member {m.filename!r}: only PNG and JPEG images")
        by_class.setdefault(p[0], []).append(m)
    for name in by_class:
        _check_class_name(name)
    return by_class


def _check_class_name(name: str) -> None:
    """A class's name is its folder's: plain text (core.text), as a data set's name is."""
    if len(name) > MAX_CLASS_NAME:
        raise InvalidDataset(
            f"class folder {name[:40]!r}...: {len(name)} characters, at most {MAX_CLASS_NAME}"
        )
    if not is_plain(name):
        raise InvalidDataset(f"class folder {name!r}: {PLAIN_MESSAGE}")


def _folder_layout(
    zf: zipfile.ZipFile, ordered: list[tuple[int, zipfile.ZipInfo]]
) -> tuple[tuple[int, int], int]:
    """The images' size (W, H: the first one's) and channels (3 if any has colour), from
    their headers only, every size checked."""
    size: tuple[int, int] | None = None
    color = False
    decoded = 0
    for _, m in ordered:
        with _open_image(zf, m) as img:
            w, h = img.size
            if not (MIN_SIDE <= w <= MAX_SIDE and MIN_SIDE <= h <= MAX_SIDE):
                raise InvalidDataset(
                    f"{m.filename!r} is {w}×{h} pixels: each side must be {MIN_SIDE} to {MAX_SIDE}"
                )
            size = size or (w, h)
            color = color or img.mode not in GRAY_MODES
            decoded += decoded_bytes(img)
    if decoded > MAX_UNCOMPRESSED_BYTES:  # each image is decoded at its own size, then resized
        raise DatasetTooLarge(
            f"the {len(ordered)} images decode into {decoded >> 20} MiB: at most 1 GiB in all"
        )
    assert size is not None  # _class_members refused a zip without images
    return size, 3 if color else 1


def _open_image(zf: zipfile.ZipFile, m: zipfile.ZipInfo) -> Image.Image:
    try:
        return open_image(read_member(zf, m))
    except InvalidDataset:
        raise
    except ImageRejected as e:
        raise InvalidDataset(f"{m.filename!r} {e}") from e
    except Exception as e:  # Pillow raises many kinds on a bad file
        raise InvalidDataset(f"{m.filename!r}: not a PNG or JPEG image ({e})") from e


def _pixels(img: Image.Image, c: int, size: tuple[int, int], name: str) -> U8:
    try:
        out = to_channels(img, c)
        if out.size != size:
            out = out.resize(size, Image.Resampling.BILINEAR)
        return np.frombuffer(out.tobytes(), dtype=np.uint8)
    except Exception as e:
        raise InvalidDataset(f"{name!r} could not be decoded ({type(e).__name__}: {e})") from e

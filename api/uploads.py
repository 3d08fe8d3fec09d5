"""Reading a data set upload: an .npz, a zip of the four MNIST IDX files, or a zip of one
folder of PNG/JPEG images per class, each into the four arrays that core.datasets checks and
stores in canonical form.

Nothing here trusts the upload: zip members are counted and sized before anything is
decompressed (and never decompressed past their declared size), a gzipped IDX file is
inflated as a stream, never past what its header promises, nothing may expand more than
MAX_RATIO times, paths are checked, arrays are loaded without pickle, arrays' dtypes and
shapes and images' sizes are read from their headers before any data is read."""

from __future__ import annotations

import gzip
import io
import math
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO, Any

import numpy as np
from PIL import Image

from api.images import GRAY_MODES, ImageRejected, decoded_bytes, open_image, to_channels
from core.datasets import (
    I64,
    IDX_NAMES,
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
                x_train, y_train, x_test, y_test = _from_npz(zf, members, max_images)
                classes = None
            elif any(_idx_key(m.filename) for m in members):
                x_train, y_train, x_test, y_test = _from_idx(zf, members, max_images)
                classes = None
            else:
                x_train, y_train, x_test, y_test, classes = _from_folders(zf, members, max_images)
    except InvalidDataset:
        raise
    except Exception as e:  # BadZipFile, unsupported compression, encrypted members, zlib...
        raise InvalidDataset(f"the file could not be read: {type(e).__name__}: {e}") from e
    return canonical(x_train, y_train, x_test, y_test, classes)


def check_image_count(count: int, max_images: int, where: str = "", what: str = "images") -> None:
    if count > max_images:
        raise DatasetTooLarge(f"{where}{count} {what}: at most {max_images} (upload_max_images)")


# ---------------------------------------------------------------------------- .npz


def _from_npz(
    zf: zipfile.ZipFile, members: list[zipfile.ZipInfo], max_images: int
) -> tuple[U8, I64, U8, I64]:
    """The four arrays, checked from their .npy headers (dtypes, shapes, counts, and that
    each member holds exactly the bytes it declares) before any data is read: a small
    upload may declare gigabytes, and reading or widening them would cost that."""
    by_name = {m.filename: m for m in members}
    missing = [k for k in NPZ_KEYS if f"{k}.npy" not in by_name]
    if missing:
        raise InvalidDataset(f"the .npz lacks {', '.join(missing)}: it needs {', '.join(NPZ_KEYS)}")
    infos = {k: by_name[f"{k}.npy"] for k in NPZ_KEYS}
    headers = {k: _npy_header(zf, info) for k, info in infos.items()}
    for k, header in headers.items():
        (_check_images if k.startswith("x_") else _check_labels)(header, k, max_images)
    check_image_count(headers["x_train"].shape[0] + headers["x_test"].shape[0], max_images)
    for k, info in infos.items():
        headers[k].check_size(info)
    arrays = {k: _read_npy(zf, info) for k, info in infos.items()}
    return (
        _images(arrays["x_train"]),
        arrays["y_train"].astype(np.int64),
        _images(arrays["x_test"]),
        arrays["y_test"].astype(np.int64),
    )


@dataclass(frozen=True)
class _NpyHeader:
    """What an .npy member declares, read before its data."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    size: int  # bytes of the header itself

    def check_size(self, info: zipfile.ZipInfo) -> None:
        """The member holds exactly the data the header declares."""
        declared = math.prod(self.shape) * self.dtype.itemsize
        if self.size + declared != info.file_size:
            raise InvalidDataset(
                f"{info.filename!r}: its header declares {declared} bytes of data, the "
                f"member holds {info.file_size - self.size}"
            )


def _npy_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> _NpyHeader:
    with zf.open(info) as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise InvalidDataset(
                    f"{info.filename!r}: .npy format {version[0]}.{version[1]}: save the "
                    "arrays with numpy.savez (formats 1.0 and 2.0)"
                )
        except ValueError as e:
            raise InvalidDataset(f"{info.filename!r}: not an .npy array ({e})") from e
        if dtype.hasobject:
            raise InvalidDataset("the .npz holds pickled (object) arrays: refused")
        return _NpyHeader(shape=tuple(shape), dtype=dtype, size=f.tell())


def _read_npy(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray[Any, Any]:
    with zf.open(info) as f:
        return np.lib.format.read_array(f, allow_pickle=False)


def _check_images(header: _NpyHeader, key: str, max_images: int) -> None:
    """uint8 (N,H,W), (N,H,W,C) or (N,C,H,W) with C in {1, 3}, N and sides in bounds."""
    if header.dtype != np.uint8:
        raise InvalidDataset(f"{key}: images must be uint8 (0..255), not {header.dtype}")
    layout = _image_layout(header.shape)
    if layout is None:
        raise InvalidDataset(
            f"{key}: shape {list(header.shape)}; images must be (N, H, W), (N, H, W, C) or "
            "(N, C, H, W) with C 1 or 3"
        )
    check_image_count(header.shape[0], max_images, f"{key}: ")
    _, h, w = layout
    if not (MIN_SIDE <= h <= MAX_SIDE and MIN_SIDE <= w <= MAX_SIDE):
        raise InvalidDataset(
            f"{key}: images are {h}×{w}: each side must be {MIN_SIDE} to {MAX_SIDE}"
        )


def _image_layout(shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(C, H, W) of an accepted image array shape, None for any other shape."""
    if len(shape) == 3:
        return 1, shape[1], shape[2]
    if len(shape) == 4 and shape[3] in (1, 3):
        return shape[3], shape[1], shape[2]
    if len(shape) == 4 and shape[1] in (1, 3):
        return shape[1], shape[2], shape[3]
    return None


def _images(x: U8) -> U8:
    """A checked image array (see _check_images) as (N, C, H, W)."""
    if x.ndim == 3:
        return np.ascontiguousarray(x[:, None])
    if x.shape[3] in (1, 3):
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return np.ascontiguousarray(x)


def _check_labels(header: _NpyHeader, key: str, max_images: int) -> None:
    if header.dtype.kind not in "iu":
        raise InvalidDataset(f"{key}: labels must be integers, not {header.dtype}")
    if len(header.shape) != 1:
        raise InvalidDataset(
            f"{key}: shape {list(header.shape)}; labels must be one-dimensional (N,)"
        )
    check_image_count(header.shape[0], max_images, f"{key}: ", "labels")


# ---------------------------------------------------------------------------- IDX


def _idx_key(filename: str) -> str | None:
    base = PurePosixPath(filename).name.removesuffix(".gz").replace(".", "-")
    return IDX_NAMES.get(base)


def _from_idx(
    zf: zipfile.ZipFile, members: list[zipfile.ZipInfo], max_images: int
) -> tuple[U8, I64, U8, I64]:
    found: dict[str, zipfile.ZipInfo] = {}
    for m in members:
        key = _idx_key(m.filename)
        if key is not None:
            if key in found:
                raise InvalidDataset(f"two IDX files for {key}: {found[key].filename!r}, "
                                     f"{m.filename!r}")  # fmt: skip
            found[key] = m
    missing = [name for name, key in IDX_NAMES.items() if key not in found]
    if missing:
        raise InvalidDataset(f"the zip lacks the IDX files {', '.join(missing)} (.gz or not)")
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    budget = _IdxBudget(MAX_UNCOMPRESSED_BYTES, max_images)
    for key, info in found.items():
        arrays[key] = _idx_member(zf, info, key, budget)
        budget.spend(arrays[key], key)
    # _check_idx_dims bounded the labels, one-dimensional, to max_images.
    return (
        np.ascontiguousarray(arrays["x_train"][:, None]),
        arrays["y_train"].astype(np.int64),
        np.ascontiguousarray(arrays["x_test"][:, None]),
        arrays["y_test"].astype(np.int64),
    )


@dataclass
class _IdxBudget:
    """What the IDX files read so far leave to the next: the bytes left, and the images
    read against max_images (the two image files together; each label file alone)."""

    bytes: int
    max_images: int
    images: int = 0

    def spend(self, array: U8, key: str) -> None:
        self.bytes -= array.nbytes
        if key.startswith("x_"):
            self.images += len(array)


def _idx_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, key: str, budget: _IdxBudget) -> U8:
    """One IDX member, gzipped or not, read as a stream: a gzip member is never inflated
    past what its header promises, and the promise is checked before any pixel is read."""
    gz = info.filename.endswith(".gz")
    try:
        with zf.open(info) as member:
            if not gz:
                return _read_idx(member, info, key, budget)
            with gzip.GzipFile(fileobj=member) as inflated:
                return _read_idx(inflated, info, key, budget)
    except (OSError, EOFError, zlib.error) as e:
        if not gz:
            raise
        raise InvalidDataset(f"{info.filename!r}: not a valid gzip file ({e})") from e


def _read_idx(
    f: IO[bytes] | gzip.GzipFile, info: zipfile.ZipInfo, key: str, budget: _IdxBudget
) -> U8:
    """IDX: magic (0, 0, 0x08 = ubyte, ndim), big-endian uint32 dims, the bytes. The dims
    are checked (shape, count, sides, the 1 GiB budget, the expansion ratio) before the
    bytes are read, and no more than they promise is ever read."""
    name = info.filename
    magic = f.read(4)
    if len(magic) < 4 or magic[:3] != b"\0\0\x08" or not 1 <= magic[3] <= 4:
        raise InvalidDataset(f"{name!r}: not an unsigned-byte IDX file (bad magic number)")
    ndim = magic[3]
    header = f.read(4 * ndim)
    if len(header) < 4 * ndim:
        raise InvalidDataset(f"{name!r}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", header)
    _check_idx_dims(dims, key, name, budget)
    size = math.prod(dims)
    if size > budget.bytes:
        raise DatasetTooLarge(
            f"{name!r}: the IDX files hold over {MAX_UNCOMPRESSED_BYTES} bytes uncompressed (1 GiB)"
        )
    check_ratio(size, info.compress_size, f"zip member {name!r}")
    raw = f.read(size + 1)
    if len(raw) != size:
        holds = "more" if len(raw) > size else len(raw)
        raise InvalidDataset(
            f"{name!r}: the header says {list(dims)} ({size} bytes), the file holds {holds}"
        )
    return np.frombuffer(raw, dtype=np.uint8).reshape(dims)


def _check_idx_dims(dims: tuple[int, ...], key: str, name: str, budget: _IdxBudget) -> None:
    if key.startswith("y_"):
        if len(dims) != 1:
            raise InvalidDataset(f"{key}: labels must be one-dimensional (N,), not {list(dims)}")
    elif len(dims) != 3:
        raise InvalidDataset(f"{key}: the IDX images must be (N, H, W), not {list(dims)}")
    elif not all(MIN_SIDE <= side <= MAX_SIDE for side in dims[1:]):
        raise InvalidDataset(
            f"{name!r}: images are {dims[1]}×{dims[2]}: each side must be {MIN_SIDE} to {MAX_SIDE}"
        )
    if key.startswith("y_"):
        check_image_count(dims[0], budget.max_images, f"{name!r}: ", "labels")
    else:  # the two image files together
        check_image_count(
            budget.images + dims[0], budget.max_images, f"{name!r} brings the count to "
        )


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

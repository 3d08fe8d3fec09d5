"""The upload forms that carry arrays: an .npz of the four arrays, or a zip of the four
MNIST IDX files; each read from its headers (dtypes, shapes, counts, sizes) before any data
is, and never past what they declare. See docs/datasets.md."""

from __future__ import annotations

import gzip
import math
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO, Any

import numpy as np

from core.datasets import (
    I64,
    IDX_NAMES,
    MAX_SIDE,
    MAX_UNCOMPRESSED_BYTES,
    MIN_SIDE,
    NPZ_KEYS,
    U8,
    check_ratio,
)
from core.errors import DatasetTooLarge, InvalidDataset

MAX_CLASS_NAME = 200  # characters, as a data set's name


def check_image_count(count: int, max_images: int, where: str = "", what: str = "images") -> None:
    if count > max_images:
        raise DatasetTooLarge(f"{where}{count} {what}: at most {max_images} (upload_max_images)")


# ---------------------------------------------------------------------------- .npz


def from_npz(
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


def idx_key(filename: str) -> str | None:
    base = PurePosixPath(filename).name.removesuffix(".gz").replace(".", "-")
    return IDX_NAMES.get(base)


def from_idx(
    zf: zipfile.ZipFile, members: list[zipfile.ZipInfo], max_images: int
) -> tuple[U8, I64, U8, I64]:
    found: dict[str, zipfile.ZipInfo] = {}
    for m in members:
        key = idx_key(m.filename)
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

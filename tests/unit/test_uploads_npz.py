"""Uploaded .npz sets, without services: the layouts they may have, and every guard."""

from __future__ import annotations

import io
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from api.uploads import parse_upload
from core.errors import DatasetTooLarge, InvalidDataset
from core.train.data import load_dataset
from tests.uploads import npz_bytes, place, zip_bytes


@pytest.mark.parametrize(
    ("layout", "expected"),
    [((12, 10), (1, 12, 10)), ((12, 10, 3), (3, 12, 10)), ((3, 12, 10), (3, 12, 10)),
     ((12, 10, 1), (1, 12, 10))],
)  # fmt: skip
def test_npz_layouts_become_nchw(
    layout: tuple[int, ...], expected: tuple[int, int, int], tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    x_train, y_train = rng.integers(0, 256, (40, *layout), dtype=np.uint8), np.arange(40) % 4
    x_test, y_test = rng.integers(0, 256, (8, *layout), dtype=np.uint8), np.arange(8) % 4
    parsed = parse_upload(npz_bytes(x_train=x_train, y_train=y_train, x_test=x_test,
                                    y_test=y_test.astype(np.uint8)))  # fmt: skip
    assert (parsed.image_shape, parsed.num_classes) == (expected, 4)
    assert (parsed.train_count, parsed.test_count) == (40, 8)
    data = load_dataset(place(parsed, tmp_path), tmp_path)
    assert data.image_shape == expected and data.num_classes == 4
    assert data.train.images.dtype == torch.uint8 and data.train.labels.dtype == torch.int64
    # The pixels survive unchanged, whatever the layout.
    first = torch.from_numpy(x_train[0])
    if first.dim() == 2:
        first = first.unsqueeze(0)
    elif layout[-1] in (1, 3):
        first = first.permute(2, 0, 1)
    assert torch.equal(data.train.images[0], first)
    assert len(data.mean) == len(data.std) == data.image_shape[0]
    assert all(s > 0 for s in data.std) and all(0 < m < 1 for m in data.mean)
    assert len(data.sha256) == 64


def test_npz_with_pickled_arrays_is_refused() -> None:
    x = np.empty(4, dtype=object)
    blob = npz_bytes(x_train=x, y_train=np.arange(4), x_test=x, y_test=np.arange(4))
    with pytest.raises(InvalidDataset, match="pickled"):
        parse_upload(blob)


def test_npz_missing_keys_wrong_dtype_and_not_a_zip_are_refused() -> None:
    x = np.zeros((4, 8, 8), np.uint8)
    with pytest.raises(InvalidDataset, match="lacks y_test"):
        parse_upload(npz_bytes(x_train=x, y_train=np.arange(4), x_test=x))
    with pytest.raises(InvalidDataset, match="uint8"):
        parse_upload(npz_bytes(x_train=x.astype(np.float32), y_train=np.arange(4) % 2,
                               x_test=x, y_test=np.arange(4) % 2))  # fmt: skip
    with pytest.raises(InvalidDataset, match=re.escape("not an .npz or .zip")):
        parse_upload(b"hello, not a zip")


@pytest.mark.parametrize(
    ("y_train", "y_test", "match"),
    [
        ([0, 1, -1, 1], [0, 1], "labels run from -1"),
        ([0, 1, 1000, 1], [0, 1], "labels run from 0 to 1000"),
        ([0, 0, 0, 0], [0, 0], "1 classes"),
        ([0.0, 1.0, 0.0, 1.0], [0, 1], "must be integers"),
        ([0, 1, 0], [0, 1], "4 images but y_train 3 labels"),
        ([[0], [1], [0], [1]], [0, 1], "one-dimensional"),
    ],
)
def test_bad_labels_are_refused(y_train: list[object], y_test: list[object], match: str) -> None:
    x_train, x_test = np.zeros((4, 8, 8), np.uint8), np.zeros((2, 8, 8), np.uint8)
    with pytest.raises(InvalidDataset, match=match):
        parse_upload(npz_bytes(x_train=x_train, y_train=np.array(y_train), x_test=x_test,
                               y_test=np.array(y_test)))  # fmt: skip


def test_bad_shapes_are_refused() -> None:
    y = np.arange(4) % 2
    for x_train, x_test, match in [
        (np.zeros((4, 8, 8, 5), np.uint8), np.zeros((4, 8, 8, 5), np.uint8), "C 1 or 3"),
        (np.zeros((4, 300, 8), np.uint8), np.zeros((4, 300, 8), np.uint8), "4 to 256"),
        (np.zeros((4, 8, 8), np.uint8), np.zeros((4, 9, 8), np.uint8), "both must be the same"),
    ]:
        with pytest.raises(InvalidDataset, match=match):
            parse_upload(npz_bytes(x_train=x_train, y_train=y, x_test=x_test, y_test=y))


def test_too_many_images_is_refused() -> None:
    x = np.random.default_rng(0).integers(0, 256, (4, 8, 8), dtype=np.uint8)
    y = np.arange(4) % 2
    with pytest.raises(DatasetTooLarge, match=r"^8 images: at most 5 \(upload_max_images\)$"):
        parse_upload(npz_bytes(x_train=x, y_train=y, x_test=x, y_test=y), max_images=5)
    with pytest.raises(DatasetTooLarge, match=r"^x_train: 4 images: at most 3 "):
        parse_upload(npz_bytes(x_train=x, y_train=y, x_test=x, y_test=y), max_images=3)
    assert parse_upload(npz_bytes(x_train=x, y_train=y, x_test=x, y_test=y), max_images=8)


def npy_declaring(shape: tuple[int, ...], dtype: str, data: bytes = b"") -> bytes:
    """An .npy member whose header declares `shape` and `dtype`, followed by `data` only."""
    buf = io.BytesIO()
    header = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + data


def npz_declaring(**members: bytes) -> bytes:
    """A small valid set whose named members are replaced by raw .npy bytes."""
    x, y = np.arange(4 * 64, dtype=np.uint8).reshape(4, 8, 8), np.arange(4) % 2
    valid = {"x_train": x, "y_train": y, "x_test": x, "y_test": y}
    raw = {}
    for key, array in valid.items():
        buf = io.BytesIO()
        np.save(buf, array)
        raw[f"{key}.npy"] = members.get(key, buf.getvalue())
    return zip_bytes(raw)


@pytest.mark.parametrize(
    ("members", "refusal", "match"),
    [
        ({"y_train": npy_declaring((10**9,), "u1")}, DatasetTooLarge,
         "y_train: 1000000000 labels: at most 200000"),
        ({"x_train": npy_declaring((10**6, 28, 28), "u1")}, DatasetTooLarge,
         "x_train: 1000000 images: at most 200000"),
        ({"x_train": npy_declaring((150_000, 8, 8), "u1"),
          "x_test": npy_declaring((150_000, 8, 8), "u1")}, DatasetTooLarge,
         "300000 images: at most 200000"),
        ({"x_train": npy_declaring((10**5, 256, 256), "f8")}, InvalidDataset,
         "x_train: images must be uint8 .0..255., not float64"),
        ({"x_train": npy_declaring((4, 8, 10**6), "u1")}, InvalidDataset,
         "8×1000000: each side must be 4 to 256"),
        ({"y_test": npy_declaring((10**8,), "f4")}, InvalidDataset,
         "y_test: labels must be integers, not float32"),
        ({"y_test": npy_declaring((10**4, 10**4), "i8")}, InvalidDataset,
         "y_test: shape .10000, 10000.; labels must be one-dimensional"),
        ({"y_train": npy_declaring((4,), "i8", bytes(8))}, InvalidDataset,
         "y_train.npy.: its header declares 32 bytes of data, the member holds 8"),
    ],
)  # fmt: skip
def test_npz_headers_are_checked_before_any_array_is_read(
    members: dict[str, bytes], refusal: type[Exception], match: str
) -> None:
    """What an .npz member's header declares is checked before its data is read or
    converted: a small upload may declare gigabytes."""
    blob = npz_declaring(**members)
    assert len(blob) < 10_000
    tracemalloc.start()
    try:
        with pytest.raises(refusal, match=match):
            parse_upload(blob)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak} bytes allocated for a {len(blob)}-byte upload"


def test_sets_with_nothing_to_learn_are_refused() -> None:
    rng = np.random.default_rng(0)
    y_train, y_test = np.arange(40) % 4, np.arange(8) % 4
    x_test = rng.integers(0, 256, (8, 8, 8), dtype=np.uint8)
    one = rng.integers(0, 256, (8, 8), dtype=np.uint8)
    for x_train, y, match in [
        (np.full((40, 8, 8), 7, np.uint8), y_train, "every pixel of every x_train image is 7"),
        (np.stack([one] * 40), y_train, "all 40 x_train images are the same image"),
        (rng.integers(0, 256, (40, 8, 8), dtype=np.uint8), np.full(40, 3), "label is 3"),
    ]:
        with pytest.raises(InvalidDataset, match=match):
            parse_upload(npz_bytes(x_train=x_train, y_train=y, x_test=x_test, y_test=y_test))

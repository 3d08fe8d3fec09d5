"""Uploaded zips of MNIST IDX files, without services: read like torchvision's, and every
guard on their headers and on gzip."""

from __future__ import annotations

import gzip
import struct
import zipfile
from pathlib import Path

import pytest

from api.uploads import parse_upload
from core.errors import DatasetTooLarge, InvalidDataset
from core.train.data import IDX_FILES, load_dataset
from tests.uploads import place, zip_bytes


def test_zip_of_mnist_idx_files(data_dir: Path, tmp_path: Path) -> None:
    raw = data_dir / "mnist-sample" / "MNIST" / "raw"
    members = {}
    for i, f in enumerate(IDX_FILES):
        blob = (raw / f).read_bytes()
        # Half gzipped, and in the dotted spelling some mirrors use.
        name = f.replace("-idx", ".idx")
        members[f"mnist/{name}.gz" if i % 2 else f"mnist/{name}"] = (
            gzip.compress(blob) if i % 2 else blob
        )
    parsed = parse_upload(zip_bytes(members))
    assert parsed.image_shape == (1, 28, 28) and parsed.num_classes == 10
    assert (parsed.train_count, parsed.test_count) == (4000, 1000)
    ours = load_dataset(place(parsed, tmp_path), tmp_path)
    builtin = load_dataset("mnist-sample", data_dir)
    assert ours.sha256 == builtin.sha256  # the same tensors, so the same digest
    # Stored at upload (float64 sums), computed for the built-in set (float32): the same.
    assert ours.mean == pytest.approx(builtin.mean, rel=1e-5)
    assert ours.std == pytest.approx(builtin.std, rel=1e-5)
    assert parsed.mean == ours.mean and len(ours.mean) == 1


def test_idx_with_a_lying_header_is_refused(data_dir: Path) -> None:
    raw = data_dir / "mnist-sample" / "MNIST" / "raw"
    members = {f: (raw / f).read_bytes() for f in IDX_FILES}
    members[IDX_FILES[0]] = members[IDX_FILES[0]][:-1]
    with pytest.raises(InvalidDataset, match="the header says"):
        parse_upload(zip_bytes(members))
    del members[IDX_FILES[3]]
    with pytest.raises(InvalidDataset, match="lacks the IDX files t10k-labels-idx1-ubyte"):
        parse_upload(zip_bytes(members))


def idx_header(*dims: int) -> bytes:
    return bytes([0, 0, 0x08, len(dims)]) + struct.pack(f">{len(dims)}I", *dims)


def idx_zip(data_dir: Path, **replace: bytes) -> bytes:
    """The four real mnist-sample IDX files, with some replaced (by their IDX_FILES name)."""
    raw = data_dir / "mnist-sample" / "MNIST" / "raw"
    members = {f"mnist/{f}": (raw / f).read_bytes() for f in IDX_FILES}
    for name, blob in replace.items():
        del members[f"mnist/{name.removesuffix('.gz')}"]
        members[f"mnist/{name}"] = blob
    return zip_bytes(members, zipfile.ZIP_STORED)


def test_a_gzipped_idx_bomb_is_refused_before_it_is_inflated(data_dir: Path) -> None:
    # An honest-looking header (170,000 digits, 133 MB) over zeros: ~130 KiB of gzip.
    n = 170_000
    bomb = gzip.compress(idx_header(n, 28, 28) + bytes(n * 28 * 28), compresslevel=9)
    assert len(bomb) < 200 << 10
    with pytest.raises(DatasetTooLarge, match=r"expands \d+ times: at most 100"):
        parse_upload(idx_zip(data_dir, **{"train-images-idx3-ubyte.gz": bomb}))


def test_a_gzipped_idx_is_never_inflated_past_its_header(data_dir: Path) -> None:
    # The header promises 10 digits; 64 MiB more follow. Reading stops one byte past the 10.
    lying = gzip.compress(idx_header(10, 28, 28) + bytes(64 << 20), compresslevel=9)
    with pytest.raises(InvalidDataset, match=r"\(7840 bytes\), the file holds more"):
        parse_upload(idx_zip(data_dir, **{"train-images-idx3-ubyte.gz": lying}))


@pytest.mark.parametrize(
    ("name", "dims", "error", "match"),
    [
        (
            "train-images-idx3-ubyte.gz",
            (200_001, 28, 28),
            DatasetTooLarge,
            "images: at most 200000",
        ),
        ("train-images-idx3-ubyte.gz", (10, 28, 300), InvalidDataset, "28×300: each side"),
        ("train-images-idx3-ubyte.gz", (10, 784), InvalidDataset, "must be .N, H, W."),
        ("train-labels-idx1-ubyte.gz", (10, 2), InvalidDataset, "one-dimensional"),
        ("train-images-idx3-ubyte", (20_000, 256, 256), DatasetTooLarge, "over 1073741824"),
    ],
)
def test_idx_headers_are_checked_before_the_data_is_read(
    name: str, dims: tuple[int, ...], error: type[Exception], match: str, data_dir: Path
) -> None:
    """A header alone, with no data after it: refused from the header."""
    blob = gzip.compress(idx_header(*dims)) if name.endswith(".gz") else idx_header(*dims)
    with pytest.raises(error, match=match):
        parse_upload(idx_zip(data_dir, **{name: blob}))


def test_too_many_images_is_refused_from_the_headers(data_dir: Path) -> None:
    """4,000 train and 1,000 test images: each file alone, then the two together, past the
    bound; labels are bounded alike. Refused before the pixels are read."""
    raw = data_dir / "mnist-sample" / "MNIST" / "raw"
    members = {f: (raw / f).read_bytes() for f in IDX_FILES}
    with pytest.raises(DatasetTooLarge, match=r"brings the count to 4000 images: at most 3999 "):
        parse_upload(zip_bytes(members), max_images=3999)
    with pytest.raises(DatasetTooLarge, match=r"brings the count to 5000 images: at most 4999 "):
        parse_upload(zip_bytes(members), max_images=4999)
    assert parse_upload(zip_bytes(members), max_images=5000).train_count == 4000

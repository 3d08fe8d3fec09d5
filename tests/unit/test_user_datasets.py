"""Uploaded data sets without services: parsing the three forms, every guard, and the
trainer reading the canonical .npz."""

from __future__ import annotations

import gzip
import io
import re
import struct
import tracemalloc
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pydantic import ValidationError

from core import datasets, uploads
from core.datasets import ParsedDataset
from core.errors import DatasetNotFound, DatasetTooLarge, InvalidDataset
from core.spec import JobSpec
from core.train import train
from core.train.data import IDX_FILES, load_dataset, user_dataset_path
from core.uploads import parse_upload


def npz_bytes(**arrays: object) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def zip_bytes(members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def image(
    mode: str, size: tuple[int, int], value: int | tuple[int, ...], fmt: str = "PNG"
) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, value).save(buf, format=fmt)
    return buf.getvalue()


def place(parsed: ParsedDataset, data_dir: Path) -> str:
    """What the worker does: the canonical .npz where the trainer reads it."""
    name = f"ds:{uuid.uuid4()}"
    path = user_dataset_path(name, data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(parsed.npz)
    return name


# ---------------------------------------------------------------------------- .npz


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
    assert data.std > 0 and 0 < data.mean < 1
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


def test_too_many_images_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads, "MAX_IMAGES", 5)
    x, y = np.zeros((4, 8, 8), np.uint8), np.arange(4) % 2
    with pytest.raises(DatasetTooLarge, match="8 images: at most 5"):
        parse_upload(npz_bytes(x_train=x, y_train=y, x_test=x, y_test=y))


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


# ---------------------------------------------------------------------------- folders


def test_zip_of_class_folders(tmp_path: Path) -> None:
    members: dict[str, bytes] = {}
    for i in range(10):
        members[f"data/dog/{i}.png"] = image("L", (16, 12), 200)  # gray, resized
        members[f"data/cat/{i}.jpg"] = image("RGB", (32, 24), (255, 0, 0), "JPEG")  # first
    members["data/cat/.DS_Store"] = b"junk"
    members["__MACOSX/data/cat/._0.jpg"] = b"junk"
    parsed = parse_upload(zip_bytes(members))
    assert parsed.classes == ("cat", "dog")  # sorted by name: cat 0, dog 1
    assert parsed.image_shape == (3, 24, 32)  # the first image's size; colour -> all RGB
    assert (parsed.train_count, parsed.test_count, parsed.num_classes) == (16, 4, 2)
    data = load_dataset(place(parsed, tmp_path), tmp_path)
    assert data.train.labels.bincount().tolist() == [8, 8]  # stratified 80/20
    assert data.test.labels.bincount().tolist() == [2, 2]
    cat = data.train.images[data.train.labels == 0][0]
    assert cat[0].float().mean() > 240 and cat[2].float().mean() < 15  # red stays red
    dog = data.train.images[data.train.labels == 1][0]
    assert (dog == 200).all()  # gray -> the same value in R, G and B
    # The same upload, the same split.
    assert parse_upload(zip_bytes(members)).sha256 == parsed.sha256


def test_grayscale_folders_stay_one_channel() -> None:
    members = {f"{k}/{i}.png": image("L", (8, 8), 10 * k) for k in range(3) for i in range(5)}
    parsed = parse_upload(zip_bytes(members))
    assert parsed.image_shape == (1, 8, 8) and parsed.num_classes == 3


@pytest.mark.parametrize("bad", ["../evil.png", "/etc/evil.png", "a/../../evil.png"])
def test_zip_with_a_traversal_member_is_refused(bad: str) -> None:
    members = {f"{k}/{i}.png": image("L", (8, 8), 0) for k in "ab" for i in range(3)}
    members[bad] = image("L", (8, 8), 0)
    with pytest.raises(InvalidDataset, match=re.escape("absolute paths and '..' are refused")):
        parse_upload(zip_bytes(members))


def test_zip_layout_problems_are_named() -> None:
    ok = {f"{k}/{i}.png": image("L", (8, 8), 0) for k in "ab" for i in range(3)}
    with pytest.raises(InvalidDataset, match=re.escape("'a/notes.txt': only PNG and JPEG")):
        parse_upload(zip_bytes({**ok, "a/notes.txt": b"hi"}))
    with pytest.raises(InvalidDataset, match="expected <class_name>/<image file>"):
        parse_upload(zip_bytes({**ok, "loose.png": image("L", (8, 8), 0)}))
    with pytest.raises(InvalidDataset, match="not a PNG or JPEG"):
        parse_upload(zip_bytes({**ok, "a/broken.png": b"not really"}))
    with pytest.raises(InvalidDataset, match="1 classes"):
        parse_upload(zip_bytes({f"a/{i}.png": image("L", (8, 8), 0) for i in range(3)}))
    with pytest.raises(InvalidDataset, match="300×8 pixels"):
        parse_upload(zip_bytes({**ok, "a/wide.png": image("L", (300, 8), 0)}))


def test_a_zip_bomb_is_refused() -> None:
    # 64 MiB of zeros deflate to ~64 KiB: a ratio of ~1000.
    bomb = zip_bytes({"a/0.png": b"\0" * (64 << 20), "b/0.png": image("L", (8, 8), 0)})
    assert len(bomb) < 1 << 20
    with pytest.raises(DatasetTooLarge, match=r"expands \d+ times: at most 100"):
        parse_upload(bomb)


def test_zip_size_and_member_count_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    members = {f"{k}/{i}.png": image("L", (8, 8), 0) for k in "ab" for i in range(3)}
    blob = zip_bytes(members, zipfile.ZIP_STORED)
    monkeypatch.setattr(datasets, "MAX_UNCOMPRESSED_BYTES", 100)
    with pytest.raises(DatasetTooLarge, match="uncompressed: at most 100"):
        parse_upload(blob)
    monkeypatch.setattr(datasets, "MAX_UNCOMPRESSED_BYTES", 1 << 30)
    monkeypatch.setattr(datasets, "MAX_MEMBERS", 5)
    with pytest.raises(DatasetTooLarge, match="6 members: at most 5"):
        parse_upload(blob)


def test_a_member_larger_than_its_header_says_is_refused() -> None:
    blob = bytearray(zip_bytes({"a/0.png": b"x" * 100, "b/0.png": b"y" * 100}, zipfile.ZIP_STORED))
    # Shrink the first member's declared size in the central directory (offset 24 in the
    # central header) to 10: reading it must stop there and refuse.
    cd = blob.index(b"PK\x01\x02")
    blob[cd + 24 : cd + 28] = (10).to_bytes(4, "little")
    with pytest.raises(InvalidDataset):
        parse_upload(bytes(blob))


def test_an_unreadable_member_is_a_422_not_a_crash() -> None:
    blob = bytearray(zip_bytes({"a/0.png": b"x" * 100, "b/0.png": b"y" * 100}))
    cd = blob.index(b"PK\x01\x02")
    blob[cd + 10 : cd + 12] = (99).to_bytes(2, "little")  # an unknown compression method
    with pytest.raises(InvalidDataset, match="compression method is not supported"):
        parse_upload(bytes(blob))


# ---------------------------------------------------------------------------- IDX


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
    assert (ours.mean, ours.std) == (builtin.mean, builtin.std)


def test_idx_with_a_lying_header_is_refused(data_dir: Path) -> None:
    raw = data_dir / "mnist-sample" / "MNIST" / "raw"
    members = {f: (raw / f).read_bytes() for f in IDX_FILES}
    members[IDX_FILES[0]] = members[IDX_FILES[0]][:-1]
    with pytest.raises(InvalidDataset, match="the header says"):
        parse_upload(zip_bytes(members))
    del members[IDX_FILES[3]]
    with pytest.raises(InvalidDataset, match="lacks the IDX files t10k-labels-idx1-ubyte"):
        parse_upload(zip_bytes(members))


# ---------------------------------------------------------------------------- spec, trainer


def test_spec_names_uploaded_sets() -> None:
    ds_id = uuid.uuid4()
    assert JobSpec(dataset=f"ds:{str(ds_id).upper()}").dataset == f"ds:{ds_id}"
    assert JobSpec().dataset == "mnist-sample"
    for bad in ["ds:", "ds:not-a-uuid", "imagenet", f"DS:{ds_id}"]:
        with pytest.raises(ValidationError, match="unknown data set"):
            JobSpec(dataset=bad)


def test_a_missing_uploaded_set_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFound, match="is missing"):
        load_dataset(f"ds:{uuid.uuid4()}", tmp_path)


@pytest.mark.parametrize("data_path", ["device", "dataloader"])
def test_trainer_on_an_rgb_non_square_set(data_path: str, tmp_path: Path) -> None:
    """Net, the export check and the record follow the data: 3×20×12, 5 classes."""
    rng = np.random.default_rng(0)
    y_train, y_test = np.arange(100) % 5, np.arange(20) % 5
    parsed = parse_upload(npz_bytes(
        x_train=rng.integers(0, 256, (100, 20, 12, 3), dtype=np.uint8), y_train=y_train,
        x_test=rng.integers(0, 256, (20, 20, 12, 3), dtype=np.uint8), y_test=y_test,
    ))  # fmt: skip
    name = place(parsed, tmp_path)
    spec = JobSpec(dataset=name, epochs=1, batch_size=32, data_path=data_path, num_workers=0)
    result = train(spec, data_dir=tmp_path)
    assert result.record["dataset"]["image_shape"] == [3, 20, 12]
    assert result.record["dataset"]["name"] == name
    from core.train.export import load_torchscript

    model = load_torchscript(result.model)
    logits = model(torch.rand(4, 3, 20, 12))
    assert logits.shape == (4, 5)


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
        ("train-images-idx3-ubyte.gz", (200_001, 28, 28), DatasetTooLarge, "200001 images"),
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


def test_a_folder_zip_of_tiny_files_with_many_pixels_is_refused() -> None:
    # 256×256 black PNGs are ~300 bytes each: 2 MiB of pixels from a few KiB.
    blank = image("L", (256, 256), 0)
    members = {f"{k}/{i}.png": blank for k in "ab" for i in range(16)}
    with pytest.raises(DatasetTooLarge, match=r"32 images of 1×256×256 pixels expands \d+ times"):
        parse_upload(zip_bytes(members))


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

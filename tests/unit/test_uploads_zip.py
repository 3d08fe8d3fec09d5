"""Uploaded zips of class folders of images, without services: the layout, and every guard."""

from __future__ import annotations

import io
import re
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from api import photo_sets
from api.images import MAX_JPEG_SCANS, MAX_PNG_CHUNKS
from api.photo_sets import PhotoOptions
from api.uploads import parse_upload
from core import datasets
from core.errors import DatasetTooLarge, InvalidDataset
from core.train.data import load_dataset
from tests.uploads import (
    image,
    many_chunks_png,
    many_scans_jpeg,
    place,
    text_bomb_png,
    zip_bytes,
)


def test_zip_of_class_folders(tmp_path: Path) -> None:
    members: dict[str, bytes] = {}
    for i in range(10):
        members[f"data/dog/{i}.png"] = image("L", (16, 12), 200)  # gray, resized
        members[f"data/cat/{i}.jpg"] = image("RGB", (32, 24), (255, 0, 0), "JPEG")  # first
    members["data/cat/.DS_Store"] = b"junk"
    members["__MACOSX/data/cat/._0.jpg"] = b"junk"
    parsed = parse_upload(zip_bytes(members), options=PhotoOptions(fit="stretch"))
    assert parsed.classes == ("cat", "dog")  # sorted by name: cat 0, dog 1
    assert parsed.image_shape == (3, 24, 24)  # the median longer side, square; colour -> RGB
    assert (parsed.train_count, parsed.test_count, parsed.num_classes) == (16, 4, 2)
    data = load_dataset(place(parsed, tmp_path), tmp_path)
    assert data.train.labels.bincount().tolist() == [8, 8]  # stratified 80/20
    assert data.test.labels.bincount().tolist() == [2, 2]
    cat = data.train.images[data.train.labels == 0][0]
    assert cat[0].float().mean() > 240 and cat[2].float().mean() < 15  # red stays red
    dog = data.train.images[data.train.labels == 1][0]
    assert (dog == 200).all()  # gray -> the same value in R, G and B
    # The same upload, the same split.
    again = parse_upload(zip_bytes(members), options=PhotoOptions(fit="stretch"))
    assert again.sha256 == parsed.sha256


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
    with pytest.raises(InvalidDataset, match="2×8 pixels"):
        parse_upload(zip_bytes({**ok, "a/thin.png": image("L", (2, 8), 0)}))


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
    with pytest.raises(
        InvalidDataset, match=r"method 99 \(unknown\): trainq reads stored and deflate"
    ):
        parse_upload(bytes(blob))


def test_a_folder_zip_of_tiny_files_with_many_pixels_is_refused() -> None:
    # 256×256 black PNGs are ~300 bytes each: 2 MiB of pixels from a few KiB.
    blank = image("L", (256, 256), 0)
    members = {f"{k}/{i}.png": blank for k in "ab" for i in range(16)}
    with pytest.raises(DatasetTooLarge, match=r"32 images of 1×256×256 pixels expands \d+ times"):
        parse_upload(zip_bytes(members))


def test_the_pixels_every_image_decodes_into_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The set's size is read from its first image, but each image is decoded at its own
    size: a small first image does not let the others decode into more than the bound."""
    members = {"a/0.png": image("L", (8, 8), 0), "b/0.png": image("L", (8, 8), 255)}
    large = image("RGBA", (256, 256), (9, 9, 9, 9))  # 256 KiB decoded
    members.update({f"{k}/{i}.png": large for k in "ab" for i in range(1, 5)})
    monkeypatch.setattr(photo_sets, "MAX_DECODED_BYTES", 1 << 20)
    with pytest.raises(DatasetTooLarge, match="10 images decode into 2 MiB: at most"):
        parse_upload(zip_bytes(members))


def test_text_chunks_of_uploaded_pngs_are_never_inflated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 40-image upload of PNGs stuffed with compressed text is read without inflating one
    text chunk: the decoder only sees the chunks that make pixels."""
    inflated: list[int] = []
    real = PngImagePlugin._safe_zlib_decompress

    def counted(s: bytes) -> bytes:
        out = real(s)
        inflated.append(len(out))
        return out

    monkeypatch.setattr(PngImagePlugin, "_safe_zlib_decompress", counted)
    bombs = {"a": text_bomb_png(50), "b": text_bomb_png(200)}
    Image.open(io.BytesIO(bombs["a"]))
    assert sum(inflated) >= 4 * ((1 << 20) - 1)  # what Pillow alone inflates for one file
    inflated.clear()
    members = {f"{k}/{i}.png": bombs[k] for k in ("a", "b") for i in range(20)}
    parsed = parse_upload(zip_bytes(members))
    assert parsed.image_shape == (1, 16, 16) and parsed.train_count + parsed.test_count == 40
    assert inflated == []


def test_too_many_images_is_refused_before_any_is_decoded() -> None:
    """Counted from the zip's directory: none of these is an image, and decoding one would
    answer InvalidDataset."""
    members = {f"{'ab'[i % 2]}/{i}.png": b"not a png" for i in range(6)}
    with pytest.raises(DatasetTooLarge, match=r"^6 images: at most 5 \(upload_max_images\)$"):
        parse_upload(zip_bytes(members), max_images=5)
    with pytest.raises(InvalidDataset, match="not a PNG or JPEG"):
        parse_upload(zip_bytes(members), max_images=6)


def test_uploaded_images_of_too_many_scans_or_chunks_are_refused_by_name() -> None:
    """A JPEG's scans and a PNG's chunks are bounded in uploads as in predictions: each costs
    the decoder work, and a file of thousands would hold an upload slot for minutes."""
    ok = {f"{k}/{i}.png": image("L", (28, 28), 9 * i) for k in "ab" for i in range(5)}
    bombs = {
        "b/scans.jpg": (many_scans_jpeg(MAX_JPEG_SCANS + 1), "scans"),
        "b/chunks.png": (many_chunks_png(MAX_PNG_CHUNKS + 1), "chunks"),
    }
    for name, (bomb, what) in bombs.items():
        with pytest.raises(InvalidDataset, match=re.escape(f"'{name}' has ") + f".* {what}"):
            parse_upload(zip_bytes({**ok, name: bomb}))


@pytest.mark.parametrize(
    "name",
    ["esc\x1b[31m", "new\nline", "nel\x85", "csi\x9b", "rtl\u202egpj.exe", "iso\u2066", "x" * 201],
)
def test_a_class_folder_name_that_is_not_plain_text_is_refused(name: str) -> None:
    members = {f"{k}/{i}.png": image("L", (8, 8), 0) for k in ("ok", name) for i in range(3)}
    with pytest.raises(InvalidDataset, match="class folder") as caught:
        parse_upload(zip_bytes(members))
    assert caught.value.message.isprintable()  # the name is quoted escaped


def _overlapping_zip(members: dict[str, bytes], entries: int) -> bytes:
    """A zip of deflated members whose central directory names the first one `entries`
    times, each entry pointing at the same local header and data (a non-recursive zip
    bomb: each entry expands no more than its own, shared, compressed bytes allow)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, blob in members.items():
            zf.writestr(name, blob)
    data = buf.getvalue()
    eocd = data.rindex(b"PK\x05\x06")
    count, cd_size, cd_offset = struct.unpack_from("<H2I", data, eocd + 10)
    first = 46 + struct.unpack_from("<H", data, cd_offset + 28)[0]  # no extra, no comment
    directory = data[cd_offset : cd_offset + first] * entries
    directory += data[cd_offset + first : cd_offset + cd_size]
    n = entries + count - 1
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, n, n, len(directory), cd_offset, 0)
    return data[:cd_offset] + directory + end


def test_a_zip_whose_entries_share_their_data_is_refused_before_any_is_read() -> None:
    """Entries that overlap each pass the per-member ratio, but together they expand far
    past MAX_RATIO times the upload: refused from the directory, nothing inflated."""
    rng = np.random.default_rng(0)
    sparse = rng.random(4 << 20) < 0.01  # 4 MiB that deflate to about 150 KiB: 28 times
    blob = np.where(sparse, rng.integers(1, 256, 4 << 20), 0).astype(np.uint8).tobytes()
    bomb = _overlapping_zip(
        {"a/0.bmp": blob, "b/0.bmp": blob[:1000]}, 200
    )  # 800 MiB from under 256 KiB
    assert len(bomb) < 256 << 10
    with zipfile.ZipFile(io.BytesIO(bomb)) as zf:
        assert all(i.file_size < 100 * i.compress_size for i in zf.infolist())
    with pytest.raises(DatasetTooLarge, match=r"expands \d+ times: at most 100"):
        parse_upload(bomb, options=PhotoOptions(skip_bad=True))

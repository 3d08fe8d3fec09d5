"""One photo made into a data set's image: any mode Pillow opens turned into 8-bit gray or
RGB (what was done said in words), then resized once, with anti-aliasing, to a square of the
set's side by padding, cropping or stretching. Uploads use it for every image of a set and
predict for one image, so an image is prepared exactly as the set's were.
See docs/datasets.md ("Photos")."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
from PIL import Image

FITS = ("pad", "crop", "stretch")
DEFAULT_FIT = "pad"
DEFAULT_SIDE_CAP = 64  # the default side: the images' median longer side, at most this
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF")
SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif")
# One image, from its header, before it is decoded: below the bound past which Pillow warns
# (api.images sets it to 2×4096×4096), which in turn refuses past twice that.
MAX_PIXELS = 32_000_000
REDUCING_GAP = 3.0  # Pillow reduces by whole factors first, down to 3 times the target
# Rows of a 16-bit or 32-bit gray image made 8-bit at once (wide_gray_to_8bit).
WIDE_STRIP_ROWS = 128
GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
_ALPHA_MODES = frozenset({"RGBA", "LA", "La", "RGBa", "PA"})

U8 = npt.NDArray[np.uint8]


def is_colour(img: Image.Image) -> bool:
    """Whether the image has colour: a palette counts as colour unless every entry is gray."""
    if img.mode == "P":
        palette = img.getpalette() or []
        rgb = [palette[i : i + 3] for i in range(0, len(palette), 3)]
        return any(not (r == g == b) for r, g, b in rgb)
    return img.mode not in GRAY_MODES


def mode_note(img: Image.Image) -> str | None:
    """What turning this image into 8 bits does, in words (None: nothing worth saying)."""
    if img.mode.startswith("I;16") or img.mode == "I":
        return "16-bit gray scaled to 8 bits"
    if img.mode == "F":
        return "float gray scaled to 8 bits"
    if img.mode in _ALPHA_MODES or "transparency" in img.info:
        return f"{img.mode} alpha composited on black"
    if img.mode == "CMYK":
        return "CMYK converted to RGB"
    if img.mode == "P":
        return "palette expanded"
    return None


def to_8bit(
    img: Image.Image, channels: int, background: tuple[int, int, int] = (0, 0, 0)
) -> Image.Image:
    """The image as "L" (channels 1) or "RGB" (3). Transparent pixels are composited on
    black (alpha is not kept); 16-bit gray is scaled by 255/65535, never clipped; float gray
    in [0, 1] is scaled to [0, 255] (above 1: read as [0, 255], clipped)."""
    mode = "L" if channels == 1 else "RGB"
    img = wide_gray_to_8bit(img)
    if img.mode in _ALPHA_MODES or "transparency" in img.info:
        rgba = img.convert("RGBA")
        under = Image.new("RGBA", rgba.size, (*background, 255))
        under.alpha_composite(rgba)
        return under.convert(mode)
    return img.convert(mode)


def wide_gray_to_8bit(img: Image.Image) -> Image.Image:
    """16-bit or 32-bit integer gray scaled by 255/65535, float gray in [0, 1] by 255 (above
    1: read as [0, 255]; NaN as 0), as "L", or "LA" where a transparency key marks pixels
    transparent; Pillow's own conversions would clip the values at 255 first. Any other
    image as it is. Converted WIDE_STRIP_ROWS rows at a time: beside the decoded pixels, only
    the 8-bit result and one strip's float64 values are held (a 32-Mpixel image compresses to
    a few hundred KiB, and whole-image float64 copies of it would take gigabytes)."""
    if not (img.mode.startswith("I") or img.mode == "F"):
        return img
    floats = img.mode == "F"
    key = img.info.get("transparency")
    keyed = isinstance(key, int) and not floats
    high = max((float(v.max()) for v in _wide_strips(img)), default=0.0) if floats else 0.0
    gray = np.empty((img.height, img.width), np.uint8)
    alpha = np.empty_like(gray) if keyed else None
    for top, values in zip(range(0, img.height, WIDE_STRIP_ROWS), _wide_strips(img), strict=True):
        rows = slice(top, top + len(values))
        scaled = (values * 255 if high <= 1.0 else values) if floats else values / 257
        gray[rows] = np.clip(np.rint(scaled), 0, 255)
        if alpha is not None:
            alpha[rows] = np.where(values == key, 0, 255)
    out = Image.fromarray(gray, "L")
    if alpha is not None:
        out.putalpha(Image.fromarray(alpha, "L"))
    return out


def _wide_strips(img: Image.Image) -> Iterator[npt.NDArray[np.float64]]:
    """A wide gray image's rows, WIDE_STRIP_ROWS at a time, as float64 ("F" with NaN as 0
    and infinities as 255 and 0; the integer modes as "I")."""
    mode = "F" if img.mode == "F" else "I"
    for top in range(0, img.height, WIDE_STRIP_ROWS):
        strip = img.crop((0, top, img.width, min(top + WIDE_STRIP_ROWS, img.height)))
        values = np.asarray(strip.convert(mode), dtype=np.float64)
        if mode == "F":
            values = np.nan_to_num(values, nan=0.0, posinf=255.0, neginf=0.0)
        yield values


def draft_for(img: Image.Image, size: int, channels: int) -> None:
    """A JPEG set to decode at a reduced scale (1/2 to 1/8) that still leaves each side at
    least REDUCING_GAP times `size`; nothing for other formats. Changes `img.size`."""
    if img.format == "JPEG":
        want = int(size * REDUCING_GAP)
        img.draft("L" if channels == 1 else "RGB", (want, want))


def fit_image(img: Image.Image, size: int, fit: str, channels: int) -> U8:
    """`img` as a (size, size, channels) uint8 array: made 8-bit (to_8bit), then resized once
    with Lanczos. `fit`: "pad" keeps the whole image and pads the short side with black,
    centred; "crop" keeps the centre square; "stretch" scales each side on its own."""
    if fit not in FITS:
        raise ValueError(f"fit {fit!r}: one of {', '.join(FITS)}")
    draft_for(img, size, channels)
    small = to_8bit(img, channels)
    w, h = small.size
    lanczos = Image.Resampling.LANCZOS
    if fit == "stretch":
        out = small.resize((size, size), lanczos, reducing_gap=REDUCING_GAP)
    elif fit == "crop":
        side = min(w, h)
        box = ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)
        out = small.resize((size, size), lanczos, box=box, reducing_gap=REDUCING_GAP)
    else:
        scale = size / max(w, h)
        nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
        inner = small.resize((nw, nh), lanczos, reducing_gap=REDUCING_GAP)
        out = Image.new(small.mode, (size, size), 0)
        out.paste(inner, ((size - nw) // 2, (size - nh) // 2))
    arr = np.asarray(out, dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


def default_side(sizes: list[tuple[int, int]], low: int, high: int) -> int:
    """The side a set's images are made when none is asked: their own where all are one
    square size within [low, high] (nothing resized), else the median of their longer sides,
    at most DEFAULT_SIDE_CAP and at least `low`."""
    if len(set(sizes)) == 1 and sizes[0][0] == sizes[0][1] and low <= sizes[0][0] <= high:
        return sizes[0][0]
    median = int(np.median([max(s) for s in sizes]))
    return max(low, min(DEFAULT_SIDE_CAP, median))

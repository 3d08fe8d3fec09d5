"""PNG and JPEG images as a model's input, for predictions and uploaded data sets alike,
decoded within the process's decode budget. See docs/datasets.md."""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import re
import struct
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import IO, Protocol

from PIL import Image, ImageOps, JpegImagePlugin

from core.photos import to_8bit

MAX_SIDE = 4096  # pixels, either side of an image sent for prediction, checked before decoding
# One image's pixels as Pillow holds them once decoded (4 bytes a pixel for RGB and RGBA),
# checked from the header: a 4096×4096 RGBA image is the most one decode may hold.
MAX_DECODED_BYTES = 64 << 20
# Pillow's own bomb check agrees: it warns past this many pixels and refuses past twice as
# many, so an image within MAX_SIDE never warns and any image it would refuse, ours does.
Image.MAX_IMAGE_PIXELS = 2 * MAX_SIDE * MAX_SIDE
MAX_ENCODED_BYTES = 16 << 20  # a PNG or JPEG file; the API's own limits are tighter
# libjpeg reads every scan of a JPEG over the whole image, whatever the scale it outputs:
# a progressive file from libjpeg has about 10, and one scan repeated thousands of times
# costs seconds of CPU each thousand. Counted before decoding.
MAX_JPEG_SCANS = 64
# Pillow reads a PNG chunk by chunk in Python: a file of many tiny chunks costs 30 times
# what its pixels do. 16 MiB of libpng's 8 KiB IDATs are 2048 chunks.
MAX_PNG_CHUNKS = 4096
STRIP_ROWS = 64  # rows converted at once while an image is reduced
REDUCING_GAP = 3  # a reduced image stays this many times the model's size
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
DECODE_WAIT_S = 5.0  # how long a decode waits for its share of the process's budget
# Modes with no colour: a data set of only these is stored with one channel.
GRAY_MODES = ("1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N")
_ALPHA_MODES = ("RGBA", "LA", "PA", "La", "RGBa")


def give_back_large_buffers(threshold: int = 4 << 20) -> None:
    """Make the C allocator (glibc) map every block over `threshold` bytes on its own, so
    that a decoded image's pixels go back to the system the moment they are freed. Left
    to itself, glibc raises that threshold past the size of the first large block freed,
    and the next images' pixels are carved from per-thread heaps that stay resident: a
    budget of decoded bytes would then not bound the process's memory. A no-op elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, threshold)
    except (OSError, AttributeError):  # no glibc (musl, macOS): its own policy stands
        pass


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The chunks that make a PNG's pixels. Pillow inflates the others it knows (zTXt, iTXt,
# iCCP: up to 64 MiB of text a file) as it reads them, work no prediction or data set needs.
PNG_PIXEL_CHUNKS = frozenset({b"IHDR", b"PLTE", b"tRNS", b"IDAT", b"IEND"})


def pixel_chunks(data: bytes) -> bytes:
    """A PNG with only the chunks its pixels need (PNG_PIXEL_CHUNKS), before Pillow reads
    any of it: its text, colour profile and other chunks are skipped unread, and a file of
    over MAX_PNG_CHUNKS chunks of any kind is refused (ImageRejected). Any other file comes
    back unchanged; a truncated PNG stays truncated, for the decoder to refuse."""
    if not data.startswith(PNG_SIGNATURE):
        return data
    view = memoryview(data)
    kept = [view[: len(PNG_SIGNATURE)]]
    at, chunks = len(PNG_SIGNATURE), 0
    while at < len(data):
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise ImageRejected(
                f"has over {MAX_PNG_CHUNKS} chunks: at most {MAX_PNG_CHUNKS} (save it again: "
                "an encoder writes its pixels in a few large chunks)"
            )
        length, kind = struct.unpack_from(">I4s", data, at) if at + 8 <= len(data) else (0, b"")
        end = at + 12 + length  # length, type, data, CRC
        if kind in PNG_PIXEL_CHUNKS or not kind:
            kept.append(view[at:end])
        if kind in (b"IEND", b""):
            break
        at = end
    return b"".join(kept)


JPEG_SOI = b"\xff\xd8"
# What libjpeg takes for a marker: 0xFF, then neither 0x00 (an 0xFF of entropy-coded data),
# 0xFF (fill) nor a restart marker (RST0-7, which sit inside a scan's data).
_JPEG_MARKER = re.compile(rb"\xff[^\x00\xff\xd0-\xd7]")
_JPEG_NO_LENGTH = frozenset({0x01, 0xD8})  # TEM, SOI
_JPEG_EOI, _JPEG_SOS = 0xD9, 0xDA


def jpeg_scans(data: bytes) -> int:
    """The scans (SOS segments) of a JPEG, up to MAX_JPEG_SCANS + 1, counted as libjpeg
    finds its markers: each segment's length is skipped, then everything up to the next
    marker, so entropy-coded data and stray bytes between segments hide no scan."""
    scans, at = 0, len(JPEG_SOI)
    while scans <= MAX_JPEG_SCANS and (found := _JPEG_MARKER.search(data, at)):
        marker, at = data[found.start() + 1], found.end()
        if marker == _JPEG_EOI or at + 2 > len(data):
            break
        if marker not in _JPEG_NO_LENGTH:
            scans += marker == _JPEG_SOS
            at += max(2, int.from_bytes(data[at : at + 2], "big"))  # libjpeg refuses < 2
    return scans


class ImageRejected(ValueError):
    """An upload that is not a usable PNG or JPEG; the message says why."""


class DecodeBusy(RuntimeError):
    """The process's decodes hold their whole budget, and none gave back enough in time."""


class DecodeBudget:
    """The bytes this process's image decodes may hold at once (Settings.max_decode_bytes).
    A decode reserves what it will hold before it decodes, and waits up to `wait_s` for
    others to give back enough; past that it raises DecodeBusy. One key holds at most
    KEY_SHARE of it, so that one key's large images never leave other keys none."""

    KEY_SHARE = 0.5

    def __init__(self, limit: int, wait_s: float = DECODE_WAIT_S) -> None:
        self.limit = limit
        self.per_key = max(1, int(limit * self.KEY_SHARE))
        self.wait_s = wait_s
        self._held = 0
        self._by_key: dict[str | None, int] = {}
        self._changed = threading.Condition()

    def for_key(self, key: str | None) -> KeyBudget:
        """The budget as one key's decodes reserve it (key: the caller's owner id)."""
        return KeyBudget(self, key)

    @contextmanager
    def reserve(self, size: int, key: str | None) -> Iterator[None]:
        size = min(size, self.per_key)  # one image never waits for more than a key may hold
        with self._changed:
            room = lambda: (  # noqa: E731
                self._held + size <= self.limit and self._by_key.get(key, 0) + size <= self.per_key
            )
            if not self._changed.wait_for(room, self.wait_s):
                raise DecodeBusy(self._busy(key, size))
            self._held += size
            self._by_key[key] = self._by_key.get(key, 0) + size
        try:
            yield
        finally:
            with self._changed:
                self._held -= size
                self._by_key[key] -= size
                if not self._by_key[key]:
                    del self._by_key[key]
                self._changed.notify_all()

    def _busy(self, key: str | None, size: int) -> str:
        """Why a decode waited in vain; another key's figures are not the caller's to know."""
        mine = self._by_key.get(key, 0)
        if mine + size > self.per_key:
            return (
                f"this key's images are being decoded already ({mine >> 20} MiB; a key may "
                f"hold {self.per_key >> 20} MiB of this API process's max_decode_bytes)"
            )
        return "this API process is decoding all the images its max_decode_bytes allows"


class Reserves(Protocol):
    """What a decode reserves its bytes with: a KeyBudget, or a parser child's way to ask
    the API's (api.parser_child)."""

    def reserve(self, size: int) -> AbstractContextManager[None]: ...


class KeyBudget:
    """DecodeBudget.reserve for one key."""

    def __init__(self, budget: DecodeBudget, key: str | None) -> None:
        self._budget = budget
        self._key = key

    def reserve(self, size: int) -> AbstractContextManager[None]:
        return self._budget.reserve(size, self._key)


def to_channels(img: Image.Image, channels: int, light_background: bool = False) -> Image.Image:
    """The image in the mode of a `channels`-channel model ("L" for 1, "RGB" for 3).
    Transparent pixels take the background's colour (black, or white for dark-on-light
    images); 16-bit grayscale is scaled to 8 bits, not clipped."""
    return to_8bit(img, channels, (255, 255, 255) if light_background else (0, 0, 0))


def decode_image(
    data: IO[bytes],
    shape: tuple[int, int, int],
    invert: bool,
    budget: Reserves | None = None,
    fit: str | None = None,
) -> bytes:
    """A PNG or JPEG as the model's input: `H*W*C` bytes (C = 1: "L", 3: "RGB"), H, W, C
    order, white on black (`invert` takes dark-on-light images). The size is checked from
    the header, before any pixel is decoded; a JPEG is decoded at a reduced scale, and any
    image is reduced strip by strip as soon as it is decoded, its share of `budget` held
    meanwhile. `fit` "pad" or "crop" (a photo set's, square): made as the set's images
    were (core.photos.fit_image); else stretched to H×W."""
    c, h, w = shape
    try:
        # Image.open reads the header only. No warnings.catch_warnings here: it is not
        # thread-safe, and this runs in a threadpool.
        with open_image(data.read(MAX_ENCODED_BYTES + 1)) as img:
            width, height = img.size
            if width > MAX_SIDE or height > MAX_SIDE or width < 1 or height < 1:
                raise ImageRejected(f"is {width}×{height} pixels: at most {MAX_SIDE}×{MAX_SIDE}")
            img.draft("L" if c == 1 else "RGB", (w, h))  # JPEG: decode at a reduced scale
            decoded, coefficients = decoded_bytes(img), coefficient_bytes(img)
            if decoded + coefficients > MAX_DECODED_BYTES:
                what = f"{decoded >> 20} MiB decoded" + (
                    f" and {coefficients >> 20} MiB of coefficients (a progressive JPEG)"
                    if coefficients
                    else ""
                )
                raise ImageRejected(
                    f"is {width}×{height} {img.mode} pixels, {what}: at most "
                    f"{MAX_DECODED_BYTES >> 20} MiB (send it smaller: the model takes {w}×{h})"
                )
            held: AbstractContextManager[None] = (
                nullcontext() if budget is None else budget.reserve(decode_cost(img, (w, h)))
            )
            with held:
                out = _model_input(img, (c, h, w), invert, fit)
            return out.tobytes()
    except (ImageRejected, DecodeBusy):
        raise
    except Image.UnidentifiedImageError as e:
        raise ImageRejected("not a PNG or JPEG image") from e
    except Image.DecompressionBombError as e:
        raise ImageRejected(f"too many pixels ({e})") from e
    except Exception as e:  # Pillow raises many kinds on a corrupt file; none is a 500
        raise ImageRejected(f"could not be decoded ({type(e).__name__}: {e})") from e


def _model_input(
    img: Image.Image, shape: tuple[int, int, int], invert: bool, fit: str | None
) -> Image.Image:
    """The decoded image at the model's C, H, W, white on black (`invert`: from dark on
    light): by the set's `fit` where it has a pad or crop one (the set's images are square),
    inverted before it is padded, so that the bands are black as the set's were; else
    reduced and stretched."""
    c, h, w = shape
    if fit in ("pad", "crop") and h == w:
        from core.photos import fit_image

        img = to_channels(img, c, light_background=invert)
        pixels = fit_image(ImageOps.invert(img) if invert else img, h, fit, c)  # (H, W, C)
        return Image.fromarray(pixels[:, :, 0] if c == 1 else pixels)
    small, box = reduced(img, (w, h))
    out = to_channels(small, c, light_background=invert)
    if out.size != (w, h) or box != (0, 0, *out.size):
        out = out.resize((w, h), Image.Resampling.BILINEAR, box, reducing_gap=3.0)
    return ImageOps.invert(out) if invert else out


def open_image(data: bytes) -> Image.Image:
    """A PNG or JPEG opened (its header read, nothing decoded), a PNG with only the chunks
    its pixels need; a JPEG of over MAX_JPEG_SCANS scans or a PNG of over MAX_PNG_CHUNKS
    chunks is refused (ImageRejected) before Pillow reads any of it."""
    if len(data) > MAX_ENCODED_BYTES:
        raise ImageRejected(f"is over {MAX_ENCODED_BYTES >> 20} MiB")
    scans = jpeg_scans(data) if data.startswith(JPEG_SOI) else 0
    if scans > MAX_JPEG_SCANS:
        raise ImageRejected(
            f"has over {MAX_JPEG_SCANS} scans: at most {MAX_JPEG_SCANS} (save it again, "
            "as a baseline JPEG or a PNG)"
        )
    img = Image.open(io.BytesIO(pixel_chunks(data)), formats=("PNG", "JPEG"))
    if isinstance(img, JpegImagePlugin.JpegImageFile):
        img.info["scans"] = scans  # for coefficient_bytes
    return img


def decoded_bytes(img: Image.Image) -> int:
    """What the image's pixels take once Pillow decodes them: 1 byte a pixel for "1", "L"
    and "P", 2 for 16-bit grayscale, 4 for every other mode (RGB is stored as RGBX)."""
    per_pixel = 1 if img.mode in ("1", "L", "P") else 2 if img.mode.startswith("I;16") else 4
    return img.width * img.height * per_pixel


def _factor(img: Image.Image, size: tuple[int, int]) -> int:
    """The integer factor an image is reduced by as it is decoded: what leaves it still
    REDUCING_GAP times `size`, for the final resize to filter, as Pillow's own
    `reducing_gap` does."""
    return max(1, min(img.width // size[0], img.height // size[1]) // REDUCING_GAP)


def decode_cost(img: Image.Image, size: tuple[int, int]) -> int:
    """The most memory decoding and reducing `img` holds at once: its decoded pixels, a
    JPEG's coefficients (coefficient_bytes), and either a few strips (reduced) or the
    full-size copies to_channels makes (not reduced)."""
    decoded = decoded_bytes(img) + coefficient_bytes(img)
    if _factor(img, size) == 1:
        return decoded + 4 * 4 * img.width * img.height
    return decoded + 3 * 4 * img.width * STRIP_ROWS * _factor(img, size)


def coefficient_bytes(img: Image.Image) -> int:
    """What libjpeg holds beside the pixels while it decodes a JPEG of several scans
    (progressive, or a scan a component): every component's DCT coefficients for the whole
    image, 64 of 2 bytes a block, at the full size whatever scale draft() chose. 0 for any
    other image: a baseline JPEG is decoded a row of blocks at a time."""
    if not isinstance(img, JpegImagePlugin.JpegImageFile) or not img.layer:
        return 0
    if not img.info.get("progressive") and img.info.get("scans", 1) <= 1:
        return 0
    scale = img.decoderconfig[0] if img.decoderconfig else 1  # set by draft()
    width, height = img.width * scale, img.height * scale  # the full size, rounded up
    h_max = max(h for _, h, _, _ in img.layer)
    v_max = max(v for _, _, v, _ in img.layer)
    blocks = 0
    for _, h, v, _ in img.layer:  # each padded to whole MCUs, as libjpeg allocates them
        cols = -(-width * h // (8 * h_max))
        rows = -(-height * v // (8 * v_max))
        blocks += (-(-cols // h) * h) * (-(-rows // v) * v)
    return blocks * 64 * 2


Box = tuple[float, float, float, float]


def reduced(img: Image.Image, size: tuple[int, int]) -> tuple[Image.Image, Box]:
    """`img` decoded and shrunk by an integer factor (see _factor) by averaging blocks
    (alpha premultiplied, so transparent pixels lend no colour), and the box the whole
    image covers in it (its last row and column may average a partial block). The work is
    done strip by strip: beside the decoded pixels, only a strip is ever converted."""
    img.load()
    f = _factor(img, size)
    if f == 1:
        return img, (0, 0, *img.size)
    out: Image.Image | None = None
    rows = f * max(1, STRIP_ROWS // f)  # whole blocks of f rows, but for the last strip
    for top in range(0, img.height, rows):
        strip = _averageable(img.crop((0, top, img.width, min(top + rows, img.height))))
        if out is None:  # the last row and column average what the edges hold
            out = Image.new(strip.mode, (-(-img.width // f), -(-img.height // f)))
        out.paste(strip.reduce(f), (0, top // f))
    assert out is not None  # f > 1: at least one strip
    straight = out.convert({"La": "LA", "RGBa": "RGBA"}.get(out.mode, out.mode))
    return straight, (0, 0, img.width / f, img.height / f)


def _averageable(img: Image.Image) -> Image.Image:
    """The image in a mode whose pixels can be averaged: alpha premultiplied ("La",
    "RGBa"), palettes expanded, 16-bit grayscale widened to "I"."""
    if img.mode in ("LA", "La"):
        return img.convert("La")
    if img.mode in _ALPHA_MODES or img.mode in ("P", "PA") or "transparency" in img.info:
        return img.convert("RGBA").convert("RGBa")
    if img.mode.startswith("I;16"):
        return img.convert("I")
    if img.mode in ("L", "RGB", "I", "F"):
        return img
    return img.convert("L" if img.mode in GRAY_MODES else "RGB")

"""Image decoding for predictions and uploads (core/images.py): modes, sizes and refusals,
in process."""

from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image

from core.images import ImageRejected, decode_image


def encoded(img: Image.Image, fmt: str = "PNG") -> io.BytesIO:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    buf.seek(0)
    return buf


def png_header(width: int, height: int) -> bytes:
    """A PNG signature, IHDR (8-bit grayscale) and IEND: a size, and no pixels at all."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_decode_image_modes() -> None:
    digit = Image.new("L", (28, 28))
    digit.paste(255, (10, 4, 18, 24))
    want = digit.tobytes()
    assert decode_image(encoded(digit), (1, 28, 28), invert=False) == want
    # Black ink on a transparent background: the background is white when inverting.
    ink = Image.new("LA", (28, 28), (0, 0))
    ink.paste((0, 255), (10, 4, 18, 24))
    assert decode_image(encoded(ink), (1, 28, 28), invert=True) == want
    # 16-bit grayscale is scaled to 8 bits, not clipped to white.
    deep = digit.convert("I").point(lambda v: v * 257)
    assert decode_image(encoded(deep.convert("I;16")), (1, 28, 28), invert=False) == want
    # RGB models get RGB; other sizes are resized.
    rgb = decode_image(encoded(digit.resize((56, 56)), "JPEG"), (3, 32, 32), invert=False)
    assert len(rgb) == 3 * 32 * 32
    with pytest.raises(ImageRejected, match="5000×1"):
        decode_image(encoded(Image.new("L", (5000, 1))), (1, 28, 28), invert=False)
    # Refused from the header alone, before any pixel is decoded (or even present).
    with pytest.raises(ImageRejected, match="5000×5000"):
        decode_image(io.BytesIO(png_header(5000, 5000)), (1, 28, 28), invert=False)
    with pytest.raises(ImageRejected, match="too many pixels"):  # Pillow's own bomb check
        decode_image(io.BytesIO(png_header(40000, 40000)), (1, 28, 28), invert=False)
    with pytest.raises(ImageRejected, match="not a PNG or JPEG"):
        decode_image(io.BytesIO(b"GIF89a"), (1, 28, 28), invert=False)
    truncated = io.BytesIO(encoded(digit).getvalue()[:60])
    with pytest.raises(ImageRejected):
        decode_image(truncated, (1, 28, 28), invert=False)

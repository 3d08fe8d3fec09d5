"""Image decoding for predictions and uploads (api/images.py): modes, sizes and refusals,
in process."""

from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image, ImageOps, PngImagePlugin

from api.images import (
    MAX_DECODED_BYTES,
    MAX_JPEG_SCANS,
    MAX_PNG_CHUNKS,
    DecodeBudget,
    DecodeBusy,
    ImageRejected,
    decode_cost,
    decode_image,
    decoded_bytes,
    pixel_chunks,
    to_channels,
)
from tests.uploads import many_chunks_png, many_scans_jpeg, text_bomb_png


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


def full_size_decode(img: Image.Image, shape: tuple[int, int, int], invert: bool) -> bytes:
    """What decode_image gave before it reduced: every conversion at full size."""
    c, h, w = shape
    out = to_channels(img, c, light_background=invert)
    out = out.resize((w, h), Image.Resampling.BILINEAR, reducing_gap=3.0)
    return (ImageOps.invert(out) if invert else out).tobytes()


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "I;16", "RGB", "1"])
def test_a_large_image_reduced_as_decoded_reads_as_at_full_size(mode: str) -> None:
    """Reduced strip by strip (alpha premultiplied) before any conversion, a 40× larger
    image gives the model what converting it at full size gave, within rounding."""
    big = Image.new("RGBA", (1120, 1130), (255, 255, 255, 0))  # white, but transparent
    big.paste((0, 0, 0, 255), (400, 160, 720, 960))  # black ink
    img = big.convert(mode) if mode not in ("I;16", "1") else big.convert("L").convert(mode)
    for shape, invert in (((1, 28, 28), True), ((3, 32, 32), False)):
        got = decode_image(encoded(img), shape, invert)
        want = full_size_decode(Image.open(encoded(img)), shape, invert)
        diff = [abs(a - b) for a, b in zip(got, want, strict=True)]
        assert max(diff) <= 8, (mode, shape, max(diff))


def test_decodes_past_the_budget_wait_then_are_refused() -> None:
    budget = DecodeBudget(100, wait_s=0.01)
    a, b, c = budget.for_key("a"), budget.for_key("b"), budget.for_key("c")
    with a.reserve(50), b.reserve(30):
        with pytest.raises(DecodeBusy, match="max_decode_bytes allows"):
            decode_image(encoded(Image.new("L", (300, 300))), (1, 28, 28), False, c)
        with c.reserve(20):  # what is left is still lent
            pass
    with a.reserve(50), b.reserve(50):  # and all of it once given back
        pass


def test_one_key_never_holds_more_than_its_share() -> None:
    """One key's large images leave the other keys half of the budget: its own next decode
    waits for its own to end, another key's goes at once."""
    budget = DecodeBudget(100, wait_s=0.01)
    greedy, other = budget.for_key("greedy"), budget.for_key(None)
    with greedy.reserve(10**9):  # one image never waits for more than a key may hold
        with pytest.raises(DecodeBusy, match="this key's images") as refused, greedy.reserve(1):
            pass
        assert "greedy" not in str(refused.value)
        with other.reserve(50):
            pass


def test_the_cost_reserved_is_the_decoded_pixels_and_a_few_strips() -> None:
    with Image.open(encoded(Image.new("RGBA", (4096, 4096)))) as img:
        assert decoded_bytes(img) == MAX_DECODED_BYTES
        assert decode_cost(img, (28, 28)) < MAX_DECODED_BYTES + (4 << 20) * 146


def test_text_chunks_of_a_png_to_predict_are_never_inflated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inflated: list[int] = []
    real = PngImagePlugin._safe_zlib_decompress
    monkeypatch.setattr(
        PngImagePlugin, "_safe_zlib_decompress", lambda s: inflated.append(1) or real(s)
    )
    bomb = text_bomb_png(200)
    assert decode_image(io.BytesIO(bomb), (1, 28, 28), invert=False) == bytes([200]) * 784
    assert inflated == []


def test_only_the_chunks_that_make_pixels_reach_the_decoder() -> None:
    """A palette image with a transparent entry keeps its palette and transparency (PLTE,
    tRNS); its text and colour profile are dropped unread; other files pass unchanged."""
    img = Image.new("P", (28, 28), 0)
    img.putpalette([0, 0, 0, 255, 255, 255])
    img.paste(1, (10, 4, 18, 24))
    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "x" * 1000, zip=True)
    buf = io.BytesIO()
    img.save(buf, format="PNG", transparency=0, pnginfo=info, icc_profile=b"\0" * 200)
    kept = pixel_chunks(buf.getvalue())
    with Image.open(io.BytesIO(kept)) as opened:
        assert opened.mode == "P" and opened.info.get("transparency") == 0
        assert "comment" not in opened.info and "icc_profile" not in opened.info
        assert opened.tobytes() == img.tobytes()
    for fmt in ("JPEG", "GIF"):
        other = encoded(Image.new("RGB", (8, 8)), fmt).getvalue()
        assert pixel_chunks(other) == other


def test_a_jpeg_of_more_scans_than_the_bound_is_refused_before_decoding() -> None:
    """libjpeg reads every scan over the whole image: the scans are counted first, walking
    the file's segments as libjpeg does (entropy-coded data, fill bytes and stray bytes
    between segments skipped), and a file of too many is refused unread."""
    shape = (3, 32, 32)
    assert len(decode_image(io.BytesIO(many_scans_jpeg(MAX_JPEG_SCANS)), shape, False)) == 3072
    for junk in (b"", b"\xff\xff", b"\x00\x01\xfe"):
        bomb = many_scans_jpeg(MAX_JPEG_SCANS + 1, junk)
        with pytest.raises(ImageRejected, match=f"over {MAX_JPEG_SCANS} scans: at most"):
            decode_image(io.BytesIO(bomb), shape, False)


def progressive_jpeg(side: int, subsampling: int) -> io.BytesIO:
    img = Image.new("RGB", (side, side), (30, 60, 90))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", progressive=True, subsampling=subsampling, quality=50)
    buf.seek(0)
    return buf


def test_a_progressive_jpeg_costs_its_full_size_coefficients_whatever_its_draft() -> None:
    """libjpeg holds a progressive JPEG's DCT coefficients for the whole image (2 bytes each,
    64 a block, every component at its own sampling) however small the scale it outputs."""
    side = 2048
    with Image.open(progressive_jpeg(side, subsampling=0)) as img:  # 4:4:4
        img.draft("RGB", (28, 28))
        assert img.size == (side // 8, side // 8)
        assert decode_cost(img, (28, 28)) >= side * side * 3 * 2
    with Image.open(progressive_jpeg(side, subsampling=2)) as img:  # 4:2:0
        img.draft("RGB", (28, 28))
        assert decode_cost(img, (28, 28)) >= side * side * 3 // 2 * 2
    with Image.open(encoded(Image.new("RGB", (side, side)), "JPEG")) as img:  # baseline
        img.draft("RGB", (28, 28))
        assert decode_cost(img, (28, 28)) < side * side


def test_a_progressive_jpeg_past_the_per_image_bound_is_refused_from_its_header() -> None:
    big = progressive_jpeg(4096, subsampling=0)  # 96 MiB of coefficients
    header = io.BytesIO(big.getvalue()[:2000])  # its frame header, and hardly any data
    for data in (big, header):
        with pytest.raises(ImageRejected, match="coefficients"):
            decode_image(data, (3, 32, 32), invert=False)
    # 4:2:0 holds half as many, within the bound.
    assert len(decode_image(progressive_jpeg(4096, 2), (3, 32, 32), invert=False)) == 3072


def test_a_png_of_more_chunks_than_the_bound_is_refused() -> None:
    """Pillow reads a PNG chunk by chunk in Python: tens of thousands of empty chunks cost
    seconds a file. Every chunk counts, the pixels' and the skipped ones alike."""
    ok = many_chunks_png(MAX_PNG_CHUNKS)
    assert decode_image(io.BytesIO(ok), (1, 28, 28), invert=False) == bytes([7]) * 784
    for kind in (b"IDAT", b"tEXt"):
        bomb = many_chunks_png(MAX_PNG_CHUNKS + 1, kind)
        with pytest.raises(ImageRejected, match=f"over {MAX_PNG_CHUNKS} chunks"):
            decode_image(io.BytesIO(bomb), (1, 28, 28), invert=False)

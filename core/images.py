"""PNG and JPEG images as a model's input: one conversion to the model's channels, for the
images a prediction is asked for and the images of an uploaded data set alike."""

from __future__ import annotations

from typing import IO

from PIL import Image, ImageOps

MAX_SIDE = 4096  # pixels, either side of an image sent for prediction, checked before decoding
# Modes with no colour: a data set of only these is stored with one channel.
GRAY_MODES = ("1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N")
_ALPHA_MODES = ("RGBA", "LA", "PA", "La", "RGBa")


class ImageRejected(ValueError):
    """An upload that is not a usable PNG or JPEG; the message says why."""


def to_channels(img: Image.Image, channels: int, light_background: bool = False) -> Image.Image:
    """The image in the mode of a `channels`-channel model ("L" for 1, "RGB" for 3).
    Transparent pixels take the background's colour (black, or white for dark-on-light
    images); 16-bit grayscale is scaled to 8 bits, not clipped."""
    mode = "L" if channels == 1 else "RGB"
    if img.mode in _ALPHA_MODES or "transparency" in img.info:
        rgba = img.convert("RGBA")
        colour = (255, 255, 255, 255) if light_background else (0, 0, 0, 255)
        background = Image.new("RGBA", rgba.size, colour)
        background.alpha_composite(rgba)
        return background.convert(mode)
    if img.mode.startswith("I;16") or img.mode == "I":
        # convert("L") would clip everything above 255 to white.
        img = img.convert("I").point(lambda v: v / 257)
    return img.convert(mode)


def decode_image(data: IO[bytes], shape: tuple[int, int, int], invert: bool) -> bytes:
    """A PNG or JPEG as the model's input: `H*W*C` bytes (C = 1: "L", 3: "RGB"), H, W, C
    order, white on black (`invert` takes dark-on-light images). The size is checked from
    the header, before any pixel is decoded."""
    c, h, w = shape
    try:
        # Image.open reads the header only. Its own bomb check (a warning past ~89 MP, an
        # error past ~179 MP) comes before ours; ours refuses far below that. No
        # warnings.catch_warnings here: it is not thread-safe, and this runs in a threadpool.
        with Image.open(data, formats=("PNG", "JPEG")) as img:
            width, height = img.size
            if width > MAX_SIDE or height > MAX_SIDE or width < 1 or height < 1:
                raise ImageRejected(f"is {width}×{height} pixels: at most {MAX_SIDE}×{MAX_SIDE}")
            img.draft("L" if c == 1 else "RGB", (w, h))  # JPEG: decode at a reduced scale
            out = to_channels(img, c, light_background=invert)
            if out.size != (w, h):
                out = out.resize((w, h), Image.Resampling.BILINEAR, reducing_gap=3.0)
            if invert:
                out = ImageOps.invert(out)
            return out.tobytes()
    except ImageRejected:
        raise
    except Image.UnidentifiedImageError as e:
        raise ImageRejected("not a PNG or JPEG image") from e
    except Image.DecompressionBombError as e:
        raise ImageRejected(f"too many pixels ({e})") from e
    except Exception as e:  # Pillow raises many kinds on a corrupt file; none is a 500
        raise ImageRejected(f"could not be decoded ({type(e).__name__}: {e})") from e

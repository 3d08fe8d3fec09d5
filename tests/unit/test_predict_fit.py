"""Predict's image files are made as the model's photo set's images were: its `fit` (pad or
crop, core.photos.fit_image) where it has one, else stretched to the model's H×W."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from api.images import decode_image


def wide_png(left_grey: int = 0) -> bytes:
    """A 40×20 white image whose 5 leftmost columns are grey."""
    img = Image.new("L", (40, 20), 255)
    img.paste(left_grey, (0, 0, 5, 20))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def decoded(blob: bytes, fit: str | None, invert: bool = False) -> np.ndarray:
    raw = decode_image(io.BytesIO(blob), (1, 20, 20), invert, None, fit)
    return np.frombuffer(raw, dtype=np.uint8).reshape(20, 20)


def test_pad_keeps_the_whole_image_between_black_bands() -> None:
    out = decoded(wide_png(255), "pad")
    assert (out[:5] == 0).all() and (out[15:] == 0).all()  # 20×10 inside, centred
    assert (out[6:14] >= 250).all()


def test_crop_keeps_the_centre_square() -> None:
    out = decoded(wide_png(128), "crop")
    assert (out >= 245).all()  # the grey columns lay outside the centre square


def test_without_a_fit_the_image_is_stretched() -> None:
    for fit in (None, "stretch"):
        out = decoded(wide_png(128), fit)
        assert (out[:, 0] < 200).all() and (out[:, -1] >= 250).all()  # the grey squeezed in


def test_invert_comes_before_the_pad_whose_bands_stay_black() -> None:
    out = decoded(wide_png(255), "pad", invert=True)  # white paper: black once inverted
    assert (out[:5] == 0).all() and (out[15:] == 0).all() and (out[6:14] <= 5).all()
    assert (decoded(wide_png(255), None, invert=True) <= 5).all()

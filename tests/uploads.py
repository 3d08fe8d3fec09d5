"""Uploads built in memory (.npz files, zips, images) and a parsed set placed where the
trainer reads it, as the worker places it."""

from __future__ import annotations

import io
import uuid
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image, PngImagePlugin

from core.datasets import ParsedDataset
from core.train.data import user_dataset_path


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


def text_bomb_png(value: int, chunks: int = 4) -> bytes:
    """A 16×16 gray PNG carrying `chunks` zTXt chunks of 1 MiB of text each (about 1 KB
    compressed; Pillow takes up to 64): Pillow inflates every one as it reads the header."""
    info = PngImagePlugin.PngInfo()
    for i in range(chunks):
        info.add_text(f"k{i}", "a" * ((1 << 20) - 1), zip=True)
    buf = io.BytesIO()
    Image.new("L", (16, 16), value).save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def place(parsed: ParsedDataset, data_dir: Path) -> str:
    """What the worker does: the canonical .npz where the trainer reads it."""
    name = f"ds:{uuid.uuid4()}"
    path = user_dataset_path(name, data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(parsed.npz)
    return name

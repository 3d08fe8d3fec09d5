"""Uploads built in memory (.npz files, zips, images) and a parsed set placed where the
trainer reads it, as the worker places it."""

from __future__ import annotations

import io
import struct
import uuid
import zipfile
import zlib
from pathlib import Path

import httpx
import numpy as np
from PIL import Image, PngImagePlugin

from core.datasets import ParsedDataset
from core.train.data import user_dataset_path


def noise_npz(n: int, seed: int = 0) -> bytes:
    """n noise digits of 28×28 (they do not compress: checking them takes a while, and a
    parse holds them a few times over)."""
    rng = np.random.default_rng(seed)
    held_out = max(n // 9, 10)
    return npz_bytes(
        x_train=rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
        y_train=rng.integers(0, 10, n),
        x_test=rng.integers(0, 256, (held_out, 28, 28), dtype=np.uint8),
        y_test=rng.integers(0, 10, held_out),
    )


def post_upload(url: str, key: str, blob: bytes) -> httpx.Response:
    """POST /datasets of `blob` as the file of a set named "a set"."""
    return httpx.post(
        f"{url}/datasets",
        headers={"Authorization": f"Bearer {key}"},
        files={"file": ("set.bin", blob, "application/octet-stream")},
        data={"name": "a set"},
        timeout=120,
    )


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


def many_scans_jpeg(scans: int, junk: bytes = b"") -> bytes:
    """A progressive 64×64 JPEG whose last scan (its SOS segment and entropy-coded data) is
    repeated until the file holds `scans` scans, each extra one preceded by `junk` (bytes
    a decoder skips between segments): libjpeg reads every scan over the whole image."""
    img = Image.new("RGB", (64, 64), (40, 90, 200))
    img.paste((250, 250, 10), (8, 8, 40, 50))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", progressive=True)
    data = buf.getvalue()
    assert data.endswith(b"\xff\xd9")
    last = data[data.rindex(b"\xff\xda") : -2]
    have = data.count(b"\xff\xda")
    return data[:-2] + (junk + last) * (scans - have) + b"\xff\xd9"


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def many_chunks_png(chunks: int, kind: bytes = b"IDAT") -> bytes:
    """A 28×28 gray PNG of `chunks` chunks: its compressed pixels one byte an IDAT, then
    empty chunks of `kind` until there are `chunks` in all."""
    buf = io.BytesIO()
    Image.new("L", (28, 28), 7).save(buf, format="PNG")
    data = buf.getvalue()
    ihdr, idat, at = b"", b"", 8
    while at < len(data):
        length, name = struct.unpack_from(">I4s", data, at)
        body = data[at + 8 : at + 8 + length]
        ihdr = body if name == b"IHDR" else ihdr
        idat += body if name == b"IDAT" else b""
        at += 12 + length
    parts = [png_chunk(b"IDAT", idat[i : i + 1]) for i in range(len(idat))]
    if kind == b"IDAT":
        parts += [png_chunk(b"IDAT", b"")] * (chunks - 2 - len(parts))
    else:  # the others before the pixels, where Pillow reads them with the header
        parts = [png_chunk(kind, b"")] * (chunks - 2 - len(parts)) + parts
    return data[:8] + png_chunk(b"IHDR", ihdr) + b"".join(parts) + png_chunk(b"IEND", b"")


# ---------------------------------------------------------------------------- hostile archives


def bz2_tar_bomb(expanded: int = 64 << 20) -> bytes:
    """A .tar.bz2 of one member of `expanded` zero bytes: a few hundred bytes that bzip2
    expands a whole block at a time, whatever its reader asked for."""
    import bz2
    import tarfile

    info = tarfile.TarInfo("a/0.png")
    info.size = expanded
    head = info.tobuf(format=tarfile.GNU_FORMAT)
    packer = bz2.BZ2Compressor(9)
    out = [packer.compress(head)]
    zeros = bytes(16 << 20)
    for _ in range(expanded // len(zeros)):
        out.append(packer.compress(zeros))
    return b"".join(out) + packer.flush()


def lying_bz2_zip(expanded: int = 64 << 20) -> bytes:
    """A zip of class folders whose one large member is bzip2 of `expanded` zero bytes and
    declares 100: a reader that trusts the directory's size expands it all at once."""
    blob = bytearray(zip_bytes({"a/0.png": bytes(expanded), "b/0.png": b"x"},
                               compression=zipfile.ZIP_BZIP2))  # fmt: skip
    for signature, at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        where = blob.index(signature)
        blob[where + at : where + at + 4] = (100).to_bytes(4, "little")  # uncompressed size
    return bytes(blob)


def old_gnu_sparse_tar(blocks: int = 600) -> bytes:
    """An old GNU tar whose one member is sparse (type S) with `blocks` extension blocks
    chained after its header: tarfile reads the whole chain, copying its map each block,
    before any check of its reader's can see the member."""
    import tarfile

    info = tarfile.TarInfo("a/0.png")
    info.type = tarfile.GNUTYPE_SPARSE
    head = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    head[482] = 1  # isextended: an extension block follows
    head[148:156] = b" " * 8
    head[148:155] = f"{sum(head):06o}\0".encode()
    entry = b"%011o\0%011o\0" % (512, 512)  # one (offset, size) pair of the map
    block = bytearray(entry * 21 + bytes(8))
    block[504] = 1  # another block follows
    last = bytearray(block)
    last[504] = 0
    return bytes(head) + bytes(block) * (blocks - 1) + bytes(last) + bytes(1024)


def pax_sparse_tar() -> bytes:
    """A pax tar whose member is GNU sparse 1.0: its map is read from the member's data,
    a number a line, as long as the first line says."""
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("a/0.png")
        info.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": "a/0.png",
            "GNU.sparse.realsize": "1000000",
        }
        data = b"99999999\n" + b"1\n" * 4000
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()

"""What reading untrusted files in a child (api.parsers) costs, against reading them in the
API's own process as before, in the same run:

1. predict's image files: a request of 1 and of 32 files (a 640×480 JPEG photo and a 280×280
   PNG digit), decoded to a 28×28 model's input by api.images.decode_image in this process,
   and by a warm child of Parsers.images (the pipe's round trip, the frames, the child);
2. an upload: api.uploads.parse_upload in this process, and by Parsers.upload (the upload
   written to the child, the .npz read back), for an .npz of 10,000 digits and a zip of 200
   JPEG photos;
3. a child's start (Python, numpy and Pillow imported, its limits set), which the API pays
   once per child: predict's at its start, an upload's at the first upload of each slot.

Each figure is the median of --rounds, in milliseconds; the ratio is child / in-process.
Prints one JSON object.    python -m bench.parsers [--rounds 30]
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from skimage import data

from api.images import DecodeBudget, decode_image
from api.parser_pool import Limits, ParserPool
from api.parsers import Parsers
from api.photo_sets import PhotoOptions
from api.uploads import parse_upload
from core.config import Settings


def median_ms(act: Callable[[], Any], rounds: int) -> float:
    act()  # warm
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        act()
        times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 3)


def photo_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(data.chelsea()).resize((640, 480)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def digit_png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(data.camera()).resize((280, 280)).save(buf, "PNG")
    return buf.getvalue()


def digits_npz(n: int) -> bytes:
    rng = np.random.default_rng(0)
    x = (rng.random((n, 28, 28)) < 0.2).astype(np.uint8) * 255
    buf = io.BytesIO()
    np.savez(buf, x_train=x, y_train=np.arange(n) % 10, x_test=x[: n // 9],
             y_test=np.arange(n // 9) % 10)  # fmt: skip
    return buf.getvalue()


def photos_zip(n: int) -> bytes:
    photos = {"cat": data.chelsea(), "cup": data.coffee(), "rocket": data.rocket()}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(n):
            name, photo = list(photos.items())[i % 3]
            img = Image.fromarray(photo).crop((i % 40, i % 30, 300 + i % 40, 250 + i % 30))
            out = io.BytesIO()
            img.save(out, "JPEG", quality=90)
            zf.writestr(f"{name}/{i}.jpg", out.getvalue())
    return buf.getvalue()


def predict_costs(parsers: Parsers, rounds: int) -> dict[str, Any]:
    budget = DecodeBudget(256 << 20).for_key("bench")
    decoder = parsers.for_key("bench")
    out: dict[str, Any] = {}
    for name, blob in (("jpeg_640x480", photo_jpeg()), ("png_280x280", digit_png())):
        for n in (1, 32):
            files = [blob] * n

            def here(files: list[bytes] = files) -> None:
                for f in files:
                    decode_image(io.BytesIO(f), (1, 28, 28), False, budget, None)

            def child(files: list[bytes] = files) -> None:
                answers = decoder.decode(files, (1, 28, 28), False, None)
                assert all(isinstance(a, bytes) for a in answers), answers[:1]

            in_process, in_child = median_ms(here, rounds), median_ms(child, rounds)
            out[f"{name}_x{n}"] = {
                "in_process_ms": in_process,
                "child_ms": in_child,
                "added_ms": round(in_child - in_process, 3),
                "ratio": round(in_child / in_process, 2),
            }
    return out


def upload_costs(parsers: Parsers, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, blob in (
        ("npz_10000_digits", digits_npz(10_000)),
        ("zip_200_photos", photos_zip(200)),
    ):

        def here(blob: bytes = blob) -> None:
            parse_upload(blob, max_images=100_000, options=PhotoOptions())

        def child(blob: bytes = blob) -> None:
            parsers.upload(blob, 100_000, PhotoOptions())

        in_process, in_child = median_ms(here, rounds), median_ms(child, rounds)
        out[name] = {
            "bytes": len(blob),
            "in_process_ms": in_process,
            "child_ms": in_child,
            "added_ms": round(in_child - in_process, 3),
            "ratio": round(in_child / in_process, 2),
        }
    return out


def start_cost(rounds: int) -> float:
    def start() -> None:
        pool = ParserPool("bench", 1, Limits(1 << 30, 5, 20))
        pool.warm(1)
        pool.close()

    return median_ms(start, rounds)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    parsers = Parsers(Settings())
    parsers.warm()
    try:
        report = {
            "cpu": cpu_name(),
            "predict": predict_costs(parsers, args.rounds),
            "upload": upload_costs(parsers, max(3, args.rounds // 10)),
            "child_start_ms": start_cost(max(3, args.rounds // 5)),
        }
    finally:
        parsers.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""How fast a class-folder zip of ~1 MP JPEGs becomes a data set, and at what peak memory.

The images: scikit-image's real colour photos (one class a photo), each a random crop of
60-100% of each side, flipped at random, its channels scaled by 0.8-1.2 (colour jitter),
resized to 1152×864 (1.0 MP) and saved as JPEG quality 90 into <photo>/<n>.jpg of a zip.
Upscaled from photos of 0.1-2 MP, they compress better than a camera's (about 160 KB each).

1. In-process: the code POST /datasets runs after its body cap (api.uploads.parse_upload's
   archive branch: the zip's members, api.photo_sets.photo_set with the form's defaults), in
   a child process, so that its peak resident memory (ru_maxrss) is its own; the child's peak
   before the parse (imports and the zip's bytes read) is reported beside it.
2. Over HTTP, where the archive is within POST /datasets' 200 MiB cap: the same zip to a
   live service (the API under uvicorn, SQLite, a redis-server), wall time of the request.

    python -m bench.upload [--count 10000] [--no-http]
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image
from skimage import data

from api.photo_archives import zip_members
from api.photo_sets import PhotoOptions, photo_set
from bench.seed import cpu_description
from core.datasets import MAX_IMAGES, MAX_UPLOAD_BYTES

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry")
SIZE = (1152, 864)


def photo(name: str) -> Image.Image:
    return Image.fromarray(np.asarray(getattr(data, name)())[..., :3])


def jittered(img: Image.Image, rng: np.random.Generator) -> bytes:
    """One ~1 MP JPEG: a random crop of `img`, maybe flipped, channels scaled, quality 90."""
    w, h = img.size
    cw, ch = int(w * rng.uniform(0.6, 1)), int(h * rng.uniform(0.6, 1))
    left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    out = img.crop((left, top, left + cw, top + ch)).resize(SIZE, Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    scaled = np.asarray(out, dtype=np.float32) * rng.uniform(0.8, 1.2, 3)
    buf = io.BytesIO()
    Image.fromarray(scaled.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def write_zip(path: Path, count: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    sources = {name: photo(name) for name in PHOTOS}
    started = time.perf_counter()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for i in range(count):
            name = PHOTOS[i % len(PHOTOS)]
            zf.writestr(f"{name}/{i:05d}.jpg", jittered(sources[name], rng))
    return {
        "images": count,
        "classes": len(PHOTOS),
        "pixels_each": SIZE[0] * SIZE[1],
        "zip_bytes": path.stat().st_size,
        "seconds_to_make": round(time.perf_counter() - started, 1),
    }


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(path: Path) -> None:
    """In the child: read the zip, parse it as POST /datasets does, print one JSON line."""
    archive = path.read_bytes()
    before = peak_mib()
    started = time.perf_counter()
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        members, skipped = zip_members(zf)
        parsed = photo_set(members, skipped, len(archive), MAX_IMAGES, PhotoOptions())
    seconds = time.perf_counter() - started
    images = parsed.train_count + parsed.test_count
    print(
        json.dumps(
            {
                "seconds": round(seconds, 2),
                "images_per_second": round(images / seconds, 1),
                "peak_rss_mib": round(peak_mib()),
                "peak_rss_mib_before_parse": round(before),
                "stored_shape": parsed.image_shape,
                "npz_bytes": len(parsed.npz),
            }
        )
    )


def in_process(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.upload", "--child", str(path)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"bench: the in-process parse failed:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def over_http(path: Path, images: int) -> dict[str, Any]:
    from tests.service import scratch_service

    with scratch_service(workers=0) as svc:
        started = time.perf_counter()
        with path.open("rb") as f:
            resp = httpx.post(
                f"{svc.url}/datasets",
                headers={"Authorization": f"Bearer {svc.keys[0]}"},
                files={"file": ("photos.zip", f, "application/zip")},
                data={"name": "bench-photos"},
                timeout=3600,
            )
        seconds = time.perf_counter() - started
    return {
        "status": resp.status_code,
        "seconds": round(seconds, 2),
        "images_per_second": round(images / seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    with tempfile.TemporaryDirectory(prefix="trainq-upload-") as tmp:
        path = Path(tmp) / "photos.zip"
        made = write_zip(path, args.count)
        print(json.dumps({"made": made}), file=sys.stderr, flush=True)
        out: dict[str, Any] = {
            "benchmark": "upload",
            "cpu": cpu_description(),
            "archive": made,
            "in_process": in_process(path),
        }
        if made["zip_bytes"] > MAX_UPLOAD_BYTES:
            out["http"] = f"not run: the zip is over POST /datasets' {MAX_UPLOAD_BYTES >> 20} MiB"
        elif not args.no_http:
            out["http"] = over_http(path, args.count)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

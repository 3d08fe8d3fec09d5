"""What decoding the images of a prediction costs the API process: a small PNG that declares
4096×4096 RGBA pixels, alone and eight requests of four at once, and as many progressive
JPEGs, whose decoder holds the whole image's coefficients whatever the scale it outputs.
Each image is decoded within a per-image bound and reduced as it is read, and the process's
decodes share one budget (Settings.max_decode_bytes, 256 MiB by default); a request that
cannot get its share in time is a 503 with Retry-After."""

from __future__ import annotations

import io
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image, ImageDraw

from tests.integration.predict.calls import predict, zeros
from tests.memory import peak_growth_mib
from tests.service import Service

pytestmark = pytest.mark.slow  # some 30 images of 64 MiB each: a few seconds

SIDE = 4096
REQUESTS, FILES = 8, 4


def large_digit() -> bytes:
    """A 4096×4096 RGBA PNG of one white stroke on transparent black: about 65 KB that
    decode into 64 MiB."""
    img = Image.new("RGBA", (SIDE, SIDE), (0, 0, 0, 0))
    ImageDraw.Draw(img).rectangle((1400, 600, 2700, 3500), fill=(255, 255, 255, 255))
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=9)
    return buf.getvalue()


def progressive_photo() -> bytes:
    """A 3000×3000 progressive 4:4:4 JPEG of one stroke: some 100 KB whose decoder holds
    51 MiB of coefficients, however small the scale it outputs."""
    img = Image.new("RGB", (3000, 3000))
    ImageDraw.Draw(img).rectangle((1000, 400, 2000, 2600), fill=(255, 255, 255))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", progressive=True, subsampling=0)
    return buf.getvalue()


def files(blob: bytes, n: int) -> list[tuple[str, tuple[str, bytes, str]]]:
    if blob.startswith(b"\xff\xd8"):
        return [("files", (f"{i}.jpg", blob, "image/jpeg")) for i in range(n)]
    return [("files", (f"{i}.png", blob, "image/png")) for i in range(n)]


def test_one_large_image_costs_about_its_decoded_pixels(service: Service, job_id: str) -> None:
    assert service.api is not None
    assert predict(service, job_id, json=zeros(1)).status_code == 200  # torch and model loaded
    blob = large_digit()
    assert len(blob) < 100 << 10
    r, growth = peak_growth_mib(
        service.api.pid, lambda: predict(service, job_id, files=files(blob, 1))
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["predictions"]) == 1
    # The decoded pixels (64 MiB) and a strip at a time beside them; not the four copies
    # a full-size conversion makes.
    assert growth < 96, f"one {len(blob)}-byte PNG raised the API's peak RSS by {growth} MiB"


@pytest.mark.parametrize("image", [large_digit, progressive_photo])
def test_concurrent_decodes_stay_within_the_process_budget(
    service: Service, job_id: str, image: Callable[[], bytes]
) -> None:
    assert service.api is not None
    assert predict(service, job_id, json=zeros(1)).status_code == 200
    blob = image()
    assert len(blob) < 1 << 20

    def burst() -> list[httpx.Response]:
        with ThreadPoolExecutor(REQUESTS) as pool:
            calls = [
                pool.submit(predict, service, job_id, files=files(blob, FILES))
                for _ in range(REQUESTS)
            ]
            return [c.result() for c in calls]

    answers, growth = peak_growth_mib(service.api.pid, burst)
    codes = [r.status_code for r in answers]
    assert set(codes) <= {200, 503}, [r.text for r in answers]
    assert 200 in codes
    for r in answers:
        if r.status_code == 503:
            assert r.headers["Retry-After"] and "decod" in r.json()["detail"]
    # The budget (256 MiB) and the requests' bodies and inference; not 32 decodes at once.
    assert growth < 320, (
        f"{REQUESTS}×{FILES} large images raised the API's peak RSS by {growth} MiB"
    )

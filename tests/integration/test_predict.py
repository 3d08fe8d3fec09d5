"""POST /jobs/{id}/predict over real HTTP: a real trained job, real held-out digits as JSON
and as PNG/JPEG files, and every refusal; SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
import math
import struct
import uuid
import zlib
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from PIL import Image
from sqlalchemy import update

from api.inference import ModelCache
from core.db import Artifact, Database
from core.images import ImageRejected, decode_image
from core.train.data import load_dataset
from tests.memory import peak_growth_mib
from tests.service import Service, wait_until

N_DIGITS = 100
TIMEOUT = 120  # the first prediction imports torch into the API process


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def predict(
    service: Service,
    job_id: str,
    key: str | None = None,
    headers: dict[str, str] | None = None,
    **kw: Any,
) -> httpx.Response:
    return httpx.post(
        f"{service.url}/jobs/{job_id}/predict",
        headers={**auth(key or service.keys[0]), **(headers or {})},
        timeout=TIMEOUT,
        **kw,
    )


def png(pixels: torch.Tensor) -> bytes:
    """(H, W) uint8 as a grayscale PNG."""
    buf = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buf, format="PNG")
    return buf.getvalue()


def zeros(n: int, c: int | None = None) -> dict[str, Any]:
    image: Any = [[0] * 28 for _ in range(28)]
    return {"images": [[image] * c if c else image for _ in range(n)]}


@pytest.fixture(scope="module")
def digits(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Real held-out digits, (N, 1, 28, 28) uint8, and their labels."""
    test = load_dataset("mnist-sample", data_dir).test
    return test.images[:N_DIGITS], test.labels[:N_DIGITS]


@pytest.fixture(scope="module")
def job_id(service: Service) -> str:
    c = service.client()
    job = c.submit({"epochs": 2, "batch_size": 128})
    status = wait_until(
        lambda: (s := c.job(job["id"])["status"]) in ("succeeded", "failed", "canceled") and s,
        180,
        "the job to train",
        interval=0.2,
    )
    assert status == "succeeded", c.job(job["id"])
    return str(job["id"])


@pytest.fixture(scope="module")
def json_result(
    service: Service, job_id: str, digits: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, Any]:
    images, _ = digits
    body = {"images": (images.float() / 255).squeeze(1).tolist()}  # H×W arrays
    r = predict(service, job_id, json=body)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def test_json_digits_are_classified(
    service: Service,
    job_id: str,
    digits: tuple[torch.Tensor, torch.Tensor],
    json_result: dict[str, Any],
) -> None:
    _, labels = digits
    preds = json_result["predictions"]
    assert len(preds) == N_DIGITS
    classes = torch.tensor([p["class"] for p in preds])
    assert (classes == labels).float().mean().item() >= 0.9
    for p in preds:
        probs = p["probabilities"]
        assert len(probs) == 10 and all(0 <= q <= 1 for q in probs)
        assert math.isclose(sum(probs), 1, abs_tol=1e-4)
        assert p["class"] == max(range(10), key=probs.__getitem__)
    # The model that answered is the job's stored model (its ETag is its sha256).
    head = httpx.head(f"{service.url}/jobs/{job_id}/model", headers=auth(service.keys[0]))
    assert head.headers["etag"] == f'"{json_result["model_sha256"]}"'


def test_json_c_h_w_arrays_and_invert(
    service: Service,
    job_id: str,
    digits: tuple[torch.Tensor, torch.Tensor],
    json_result: dict[str, Any],
) -> None:
    images, _ = digits
    x = images[:8].float() / 255
    expected = [p["class"] for p in json_result["predictions"][:8]]
    r = predict(service, job_id, json={"images": x.tolist()})  # 1×28×28 arrays
    assert r.status_code == 200, r.text
    assert [p["class"] for p in r.json()["predictions"]] == expected
    r = predict(service, job_id, json={"images": (1 - x).tolist()}, params={"invert": "true"})
    assert r.status_code == 200, r.text
    assert [p["class"] for p in r.json()["predictions"]] == expected


def test_png_files_match_json(
    service: Service,
    job_id: str,
    digits: tuple[torch.Tensor, torch.Tensor],
    json_result: dict[str, Any],
) -> None:
    images, _ = digits
    n = 8
    files = [("files", (f"digit{i}.png", png(images[i, 0]), "image/png")) for i in range(n)]
    r = predict(service, job_id, files=files)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model_sha256"] == json_result["model_sha256"]
    for got, want in zip(out["predictions"], json_result["predictions"][:n], strict=True):
        assert got["class"] == want["class"]
        assert got["probabilities"] == pytest.approx(want["probabilities"], abs=1e-5)

    # Black on white, with the form field `invert`: the same pixels once inverted back.
    files = [("files", (f"ink{i}.png", png(255 - images[i, 0]), "image/png")) for i in range(n)]
    r = predict(service, job_id, files=files, data={"invert": "true"})
    assert r.status_code == 200, r.text
    assert [p["class"] for p in r.json()["predictions"]] == [
        p["class"] for p in json_result["predictions"][:n]
    ]


def test_larger_rgb_jpeg_is_resized(
    service: Service,
    job_id: str,
    digits: tuple[torch.Tensor, torch.Tensor],
    json_result: dict[str, Any],
) -> None:
    images, _ = digits
    n = 8
    files = []
    for i in range(n):
        img = Image.fromarray(images[i, 0].numpy()).convert("RGB").resize((112, 112))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=95)
        files.append(("files", (f"digit{i}.jpg", buf.getvalue(), "image/jpeg")))
    r = predict(service, job_id, files=files)
    assert r.status_code == 200, r.text
    got = [p["class"] for p in r.json()["predictions"]]
    want = [p["class"] for p in json_result["predictions"][:n]]
    assert sum(g == w for g, w in zip(got, want, strict=True)) >= n - 2  # JPEG is lossy


def detail(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 422, r.text
    errors: list[dict[str, Any]] = r.json()["detail"]
    return errors


def test_invalid_json_images_are_422_naming_the_problem(service: Service, job_id: str) -> None:
    short_rows = {"images": [[[0.0] * 27 for _ in range(28)]]}
    [e] = detail(predict(service, job_id, json=short_rows))
    assert e["loc"] == ["body", "images", 0, 0] and "27 values" in e["msg"]
    assert "1×28×28" in e["msg"]

    few_rows = {"images": [[[0.0] * 28 for _ in range(27)]]}
    [e] = detail(predict(service, job_id, json=few_rows))
    assert e["loc"] == ["body", "images", 0] and "27 rows" in e["msg"]

    [e] = detail(predict(service, job_id, json=zeros(1, c=3)))
    assert e["loc"] == ["body", "images", 0] and "3 channels" in e["msg"]

    body = zeros(2)
    body["images"][1] = [[0.5] * 28 for _ in range(28)]
    body["images"][1][3] = [*[0.5] * 5, 1.5, *[0.5] * 22]
    [e] = detail(predict(service, job_id, json=body))
    assert e["loc"] == ["body", "images", 1, 3, 5] and e["type"] == "less_than_equal"

    for bad in ("NaN", "Infinity", "-Infinity"):
        raw = json.dumps(zeros(1)).replace("0", bad, 1)
        r = predict(service, job_id, content=raw, headers={"Content-Type": "application/json"})
        [e] = detail(r)
        assert e["loc"] == ["body", "images", 0, 0, 0] and e["type"] == "finite_number"

    r = predict(service, job_id, json=zeros(257))
    [e] = detail(r)
    assert e["loc"] == ["body", "images"] and e["type"] == "too_long"
    assert len(r.content) < 2000  # the request is not echoed back

    for body in ({"images": []}, {"images": "x"}, {}, {"images": [[[0]]], "extra": 1}):
        assert detail(predict(service, job_id, json=body))
    r = predict(service, job_id, content=b"{", headers={"Content-Type": "application/json"})
    assert detail(r)[0]["type"] == "json_invalid"


def test_invalid_files_are_422_naming_the_file(
    service: Service, job_id: str, digits: tuple[torch.Tensor, torch.Tensor]
) -> None:
    good = ("files", ("good.png", png(digits[0][0, 0]), "image/png"))
    garbage = ("files", ("garbage.png", b"\x89PNG not really", "image/png"))
    [e] = detail(predict(service, job_id, files=[good, garbage]))
    assert e["loc"] == ["body", "files", 1] and "garbage.png" in e["msg"]

    gif = io.BytesIO()
    Image.new("L", (28, 28)).save(gif, format="GIF")
    [e] = detail(predict(service, job_id, files=[("files", ("a.gif", gif.getvalue()))]))
    assert "a.gif" in e["msg"] and "not a PNG or JPEG" in e["msg"]

    wide = io.BytesIO()
    Image.new("L", (4097, 1)).save(wide, format="PNG")
    [e] = detail(predict(service, job_id, files=[("files", ("wide.png", wide.getvalue()))]))
    assert "4097×1" in e["msg"] and "wide.png" in e["msg"]

    tiny = png(digits[0][0, 0])
    many = [("files", (f"d{i}.png", tiny, "image/png")) for i in range(33)]
    [e] = detail(predict(service, job_id, files=many))
    assert e["loc"] == ["body", "files"] and "32" in e["msg"]

    [e] = detail(predict(service, job_id, files=[("file", ("d.png", tiny, "image/png"))]))
    assert e["loc"] == ["body", "file"]
    [e] = detail(predict(service, job_id, files=[good], data={"invert": "perhaps"}))
    assert e["loc"] == ["body", "invert"]
    only_invert = (
        b'--xyz\r\nContent-Disposition: form-data; name="invert"\r\n\r\ntrue\r\n--xyz--\r\n'
    )
    r = predict(
        service,
        job_id,
        content=only_invert,
        headers={"Content-Type": "multipart/form-data; boundary=xyz"},
    )
    [e] = detail(r)
    assert e["loc"] == ["body", "files"] and "at least one" in e["msg"]


def test_size_limits_are_413(service: Service, job_id: str) -> None:
    big = [("files", ("big.png", b"\0" * ((1 << 20) + 1), "image/png"))]
    r = predict(service, job_id, files=big)
    assert r.status_code == 413, r.text

    def chunked() -> Iterator[bytes]:  # no Content-Length: the route counts as it reads
        yield b'{"images": ['
        row = b"[" + b",".join([b"0.5"] * 28) + b"]"
        image = b"[" + b",".join([row] * 28) + b"]"
        for i in range(2200):  # ~5.5 MB, past 256 images' worth of JSON
            yield (b"," if i else b"") + image
        yield b"]}"

    r = predict(service, job_id, content=chunked(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert "JSON body over" in r.json()["detail"]


def test_json_bodies_cost_no_more_memory_than_the_images_they_may_hold(
    service: Service, job_id: str
) -> None:
    """Bodies under the byte cap that would parse into far more objects than 256 images of
    1×28×28 (short numbers, empty arrays, 200,000 numbers out of range): 413 or a short
    422, and the API's peak memory stays near the body's size."""
    assert service.api is not None
    assert predict(service, job_id, json=zeros(1)).status_code == 200  # torch and model loaded
    cap = 256 * 28 * 28 * 24  # JSON_BYTES_PER_VALUE
    one_row = b'{"images": [[[' + b",".join([b"0"] * (cap // 2 - 20)) + b"]]]}"
    empty_rows = b'{"images": [[' + b",".join([b"[]"] * (cap // 3 - 20)) + b"]]}"
    for body in (one_row, empty_rows):
        send = partial(
            predict, service, job_id, content=body, headers={"Content-Type": "application/json"}
        )
        r, growth = peak_growth_mib(service.api.pid, send)
        assert growth < 40, f"{growth} MiB for a {len(body)}-byte body"
        assert r.status_code == 413, r.text
        assert "256 images of 1×28×28" in r.json()["detail"]

    too_bright = {"images": [[[2] * 28 for _ in range(28)] for _ in range(256)]}
    r, growth = peak_growth_mib(service.api.pid, lambda: predict(service, job_id, json=too_bright))
    assert growth < 40, f"{growth} MiB for 200,704 values out of range"
    errors = detail(r)
    assert len(errors) == 20 and errors[0]["loc"] == ["body", "images", 0, 0, 0]
    assert {e["type"] for e in errors} == {"less_than_equal"}


def test_wrong_media_type_is_415(service: Service, job_id: str) -> None:
    r = predict(service, job_id, content=b"hello", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415, r.text


def test_jobs_that_are_not_visible_or_not_done(service: Service, job_id: str) -> None:
    body = zeros(1)
    r = httpx.post(f"{service.url}/jobs/{job_id}/predict", json=body)
    assert r.status_code == 401
    assert predict(service, str(uuid.uuid4()), json=body).status_code == 404
    assert predict(service, job_id, key=service.keys[1], json=body).status_code == 404
    assert predict(service, job_id, key=service.admin_key, json=body).status_code == 200

    c = service.client()
    busy = c.submit({"epochs": 50})
    r = predict(service, busy["id"], json=body)
    assert r.status_code == 409 and "no model yet" in r.json()["detail"], r.text
    c.cancel(busy["id"])
    wait_until(lambda: c.job(busy["id"])["status"] == "canceled", 60, "the job to stop")
    assert predict(service, busy["id"], json=body).status_code == 409


def test_stored_model_failing_its_sha256_is_500(service: Service, job_id: str) -> None:
    """A stored hash that does not match the stored bytes: never loaded, never cached."""
    db = Database(service.database_url)
    try:
        with db.writer() as s:
            real = s.get(Artifact, job_id)
            assert real is not None
            sha = real.sha256
            s.execute(update(Artifact).where(Artifact.job_id == job_id).values(sha256="0" * 64))
        r = predict(service, job_id, json=zeros(1))
        assert r.status_code == 500 and "sha256" in r.json()["detail"], r.text
        with db.writer() as s:
            s.execute(update(Artifact).where(Artifact.job_id == job_id).values(sha256=sha))
        assert predict(service, job_id, json=zeros(1)).status_code == 200
    finally:
        db.dispose()


# In-process checks of the pieces the route is made of.


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


def test_model_cache_is_lru() -> None:
    cache = ModelCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert len(cache) == 2


def test_a_body_of_200000_keys_is_a_short_422_at_little_cost(service: Service, job_id: str) -> None:
    """A body that is structurally wrong (200,000 keys where one, `images`, is allowed) is
    refused before any per-key work: at most 20 errors, and the API's peak memory stays
    near the body's size."""
    assert service.api is not None
    assert predict(service, job_id, json=zeros(1)).status_code == 200  # torch and model loaded
    keys = b",".join(b'"k%06d":0' % i for i in range(200_000))
    for body, n in (
        (b"{" + keys + b"}", 200_000),
        (b'{"images": [[[0]]], ' + keys + b"}", 200_001),
    ):
        send = partial(
            predict, service, job_id, content=body, headers={"Content-Type": "application/json"}
        )
        r, growth = peak_growth_mib(service.api.pid, send)
        assert growth < 16, f"{growth} MiB for a {len(body)}-byte body of 200,000 keys"
        errors = detail(r)
        assert 1 <= len(errors) <= 20 and len(r.content) < 4000
        assert errors[0]["loc"] == ["body"] and f"{n} keys" in errors[0]["msg"], errors

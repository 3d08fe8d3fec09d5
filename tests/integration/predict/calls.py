"""Calls to POST /jobs/{id}/predict, the bodies they send and the refusals they read."""

from __future__ import annotations

import io
from typing import Any

import httpx
import torch
from PIL import Image

from tests.service import Service

N_DIGITS = 100  # the real held-out digits the tests classify
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


def detail(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 422, r.text
    errors: list[dict[str, Any]] = r.json()["detail"]
    return errors

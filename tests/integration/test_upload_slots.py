"""Uploads being checked, over real HTTP: one key holds at most upload_max_per_key of the
API process's max_parallel_uploads (past it, that key gets 429 and the other keys' uploads
go on), and an upload declaring more than upload_max_images images is refused (413) before
any of them is decoded."""

from __future__ import annotations

import contextlib
import io
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from core.owners import owner_id
from tests.service import Service, fresh_service
from tests.uploads import noise_npz, post_upload

NOT_A_ZIP = b"not a zip: refused (422) once its slot is taken"


def api(tmp_path: Path, env: dict[str, str]) -> contextlib.AbstractContextManager[Service]:
    """The API alone, two uploads checked at once, with `env`."""
    return fresh_service(tmp_path, None, {"TRAINQ_MAX_PARALLEL_UPLOADS": "2"} | env)


@pytest.mark.slow  # a few seconds: two uploads are checked while the other key's are sent
def test_a_key_holding_its_share_leaves_the_other_slots_to_other_keys(tmp_path: Path) -> None:
    """Alice sends two slow uploads at once (noise: checked for seconds) against two slots;
    Bob keeps uploading until both of hers have ended. Her second finds her share taken;
    every one of Bob's finds a slot (a file that is no zip answers 422 once checked)."""
    blobs = [noise_npz(72_000, seed) for seed in (0, 1)]
    with api(tmp_path, {}) as service:
        alice, bob = service.keys
        with ThreadPoolExecutor(2) as pool:
            mine = [pool.submit(post_upload, service.url, alice, blob) for blob in blobs]
            theirs = [post_upload(service.url, bob, noise_npz(900, 2))]
            while not all(f.done() for f in mine):
                theirs.append(post_upload(service.url, bob, NOT_A_ZIP))
            answers = [f.result() for f in mine]
    assert theirs[0].status_code == 201, theirs[0].text[:300]
    refused_bob = [r.json() for r in theirs if r.status_code == 429]
    assert not refused_bob and {r.status_code for r in theirs[1:]} <= {422}, refused_bob[:1]
    assert sorted(r.status_code for r in answers) == [201, 429], [r.text[:300] for r in answers]
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.headers["retry-after"] == "5"
    assert refused.json()["detail"].startswith("this key has 1 uploads being checked already")
    assert {k: v for k, v in refused.json().items() if k != "detail"} == {
        "limit": "upload_max_per_key",
        "value": 1,
        "usage": 1,
        "owner": owner_id(alice),
        "retry_after_s": 5,
    }


def folders_zip(n: int) -> bytes:
    """n members that would be PNG images in two class folders, none decodable: a parse
    that decoded one would answer 422, not 413."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(n):
            zf.writestr(f"{'ab'[i % 2]}/{i}.png", b"not a png")
    return buf.getvalue()


@pytest.mark.slow  # an API of its own; the bound itself: tests/unit/test_uploads_*.py
def test_an_upload_past_upload_max_images_is_413_before_decoding(tmp_path: Path) -> None:
    with api(tmp_path, {"TRAINQ_UPLOAD_MAX_IMAGES": "50"}) as service:
        alice = service.keys[0]
        r = post_upload(service.url, alice, folders_zip(51))
        assert r.status_code == 413, r.text[:300]
        assert r.json()["detail"] == "51 images: at most 50 (upload_max_images)"
        r = post_upload(service.url, alice, folders_zip(50))
        assert r.status_code == 422, r.text[:300]  # within the bound: decoded, and broken

"""Every upload is read in a parser child (api.parsers), over real HTTP: the archives that
took the API down are refused with a clear 4xx and cost the API's own memory nothing; an
upload that needs more memory or CPU than a child may take is a 413 that frees its slot,
and the next upload, the same key's or another's, is read by a fresh child."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from tests.memory import peak_growth_mib
from tests.service import fresh_service
from tests.uploads import (
    bz2_tar_bomb,
    lying_bz2_zip,
    noise_npz,
    old_gnu_sparse_tar,
    pax_sparse_tar,
    post_upload,
)

HOSTILE = {
    "tar.bz2 bomb": (bz2_tar_bomb, "the archive is compressed with bzip2"),
    "zip of a lying bzip2 member": (lying_bz2_zip, "'a/0.png' is compressed with method 12"),
    "old GNU sparse chain": (old_gnu_sparse_tar, "'a/0.png' is a sparse file"),
    "pax sparse map": (pax_sparse_tar, "'a/0.png' is a sparse file"),
}


def test_hostile_archives_are_refused_by_name_and_cost_the_api_nothing(tmp_path: Path) -> None:
    blobs = {what: make() for what, (make, _) in HOSTILE.items()}
    env = {"TRAINQ_UPLOAD_PARSER_MEMORY": str(512 << 20), "TRAINQ_UPLOAD_MAX_IMAGES": "200000"}
    with fresh_service(tmp_path, None, env) as service:
        assert service.api is not None
        alice = service.keys[0]
        warm = post_upload(service.url, alice, noise_npz(100))  # its upload child started
        assert warm.status_code == 201, warm.text[:300]
        for what, (_, why) in HOSTILE.items():
            send = partial(post_upload, service.url, alice, blobs[what])
            r, growth = peak_growth_mib(service.api.pid, send)
            assert r.status_code == 422, (what, r.text[:300])
            assert why in r.json()["detail"][0]["msg"], (what, r.text[:300])
            assert growth < 32, f"{what} raised the API's peak RSS by {growth} MiB"
        hungry = noise_npz(150_000)
        r, growth = peak_growth_mib(
            service.api.pid, lambda: post_upload(service.url, alice, hungry)
        )
        assert r.status_code == 413, r.text[:300]
        assert r.json()["detail"] == "the upload needs more than 512 MiB of memory to read"
        # The API holds the 130 MB body it was sent, not what reading it takes.
        assert growth < 1.5 * (len(hungry) >> 20), f"the API's peak RSS rose by {growth} MiB"
        r = post_upload(service.url, alice, noise_npz(100, seed=1))
        assert r.status_code == 201, r.text[:300]


@pytest.mark.slow  # an API of its own and seconds of CPU
def test_an_upload_over_its_cpu_seconds_frees_its_slot_and_others_upload_meanwhile(
    tmp_path: Path,
) -> None:
    env = {
        "TRAINQ_UPLOAD_PARSER_CPU_S": "0.5",
        "TRAINQ_UPLOAD_PARSER_CPU_S_PER_MIB": "0",
        "TRAINQ_UPLOAD_MAX_IMAGES": "200000",
        "TRAINQ_MAX_PARALLEL_UPLOADS": "2",
    }
    slow = noise_npz(150_000)
    with fresh_service(tmp_path, None, env) as service:
        alice, bob = service.keys
        with ThreadPoolExecutor(1) as pool:
            hers = pool.submit(post_upload, service.url, alice, slow)
            theirs = [post_upload(service.url, bob, noise_npz(100, seed=2))]
            while not hers.done():
                theirs.append(post_upload(service.url, bob, noise_npz(100, seed=3)))
        r = hers.result()
        assert r.status_code == 413, r.text[:300]
        assert (
            r.json()["detail"]
            == "the upload took over 0.5 CPU seconds to read (the most a request may)"
        )
        assert {t.status_code for t in theirs} == {201}, [t.text[:200] for t in theirs]
        assert post_upload(service.url, alice, noise_npz(100, seed=4)).status_code == 201

"""A worker host's copies of uploaded data sets: the deletion of a set runs on the API's
host, and a write that a crash (kill -9) cut short leaves its temporary file beside the copy.
The workers' reconciling pass takes both away, so neither fills the host's disk; a copy of a
set that still exists, and a write still under way, are left alone."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx

from tests.faults.test_worker_disk_full import _digits_npz
from tests.recovery import FAST_RECOVERY
from tests.service import fresh_service, status_of, wait_until


def test_deleted_sets_and_cut_writes_leave_the_worker_host(tmp_path: Path) -> None:
    with fresh_service(tmp_path, None, FAST_RECOVERY) as svc:
        key = {"Authorization": f"Bearer {svc.admin_key}"}

        def upload(name: str) -> dict[str, str]:
            answer = httpx.post(
                f"{svc.url}/datasets", headers=key, files={"file": ("d.npz", _digits_npz())},
                data={"name": name}, timeout=60,
            )  # fmt: skip
            assert answer.status_code == 201, answer.text
            return answer.json()  # type: ignore[no-any-return]

        gone, kept = upload("gone"), upload("kept")
        svc.start_worker()
        svc.wait_for_workers(1)
        c = svc.client(svc.admin_key)
        for ds in (gone, kept):
            job = c.submit({"dataset": ds["dataset"], "epochs": 1, "max_steps": 2})
            wait_until(lambda j=job: status_of(c, j["id"]) == "succeeded", 120, "the job")
        folder = svc.data_dir / "datasets" / "by-id"
        placed = {ds["id"]: folder / f"{ds['id']}.npz" for ds in (gone, kept)}
        assert all(p.is_file() for p in placed.values())
        cut = folder / f".{gone['id']}.npz.k2j4h1.tmp"  # as a killed write_atomic leaves it
        cut.write_bytes(b"half a data set")
        hours_ago = time.time() - 2 * 3600
        os.utime(cut, (hours_ago, hours_ago))
        writing = folder / f".{kept['id']}.npz.a8b7c6.tmp"  # another host's write, under way
        writing.write_bytes(b"being written")
        deleted = httpx.delete(f"{svc.url}/datasets/{gone['id']}", headers=key, timeout=10)
        assert deleted.status_code == 204, deleted.text
        wait_until(
            lambda: not placed[gone["id"]].exists() and not cut.exists(), 30, "the leftovers gone"
        )
    assert placed[kept["id"]].is_file()
    assert writing.is_file()

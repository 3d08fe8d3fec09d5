"""A worker host whose disk is full: placing the job's data set there fails for the
machine, not for the job. The job is restarted (another host may have room) within its
max_restarts, then fails `worker_disk_full`, saying so; it never fails `internal` at once."""

from __future__ import annotations

import contextlib
import io
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

from tests.recovery import FAST_RECOVERY
from tests.service import fresh_service, status_of, wait_until
from tests.tmpfs import tmpfs


@contextlib.contextmanager
def full_tmpfs(folder: Path) -> Iterator[None]:
    """`folder` as a 256 KiB tmpfs, filled to the last block."""
    with tmpfs(folder, "256k"):
        subprocess.run(["dd", "if=/dev/zero", f"of={folder}/filler", "bs=4k"], capture_output=True)
        yield


def _digits_npz() -> bytes:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (600, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 2, 600)
    buf = io.BytesIO()
    np.savez(buf, x_train=x[:500], y_train=y[:500], x_test=x[500:], y_test=y[500:])
    return buf.getvalue()


def test_a_full_disk_restarts_the_job_then_names_itself(tmp_path: Path) -> None:
    with fresh_service(tmp_path, None, FAST_RECOVERY) as svc:
        answer = httpx.post(
            f"{svc.url}/datasets",
            headers={"Authorization": f"Bearer {svc.admin_key}"},
            files={"file": ("tiny.npz", _digits_npz())},
            data={"name": "tiny"},
            timeout=60,
        )
        assert answer.status_code == 201, answer.text
        with full_tmpfs(svc.data_dir / "datasets"):
            svc.start_worker()
            svc.wait_for_workers(1)
            c = svc.client(svc.admin_key)
            spec = {"dataset": answer.json()["dataset"], "epochs": 1, "max_steps": 3,
                    "max_restarts": 1, "export": ["torchscript"]}  # fmt: skip
            job = c.submit(spec)
            wait_until(lambda: status_of(c, job["id"]) == "failed", 120, "the job's end", 0.5)
            done = c.job(job["id"])
    assert done["error"]["code"] == "worker_disk_full", done["error"]
    assert "disk is full" in done["error"]["message"]
    assert done["attempt"] == 2  # restarted once, as max_restarts allows

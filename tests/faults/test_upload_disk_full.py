"""Uploads on a machine whose disks fill or whose API dies. A body that cannot be spooled
(the API's temporary folder full) is the machine's fault, not the upload's: 503 with
Retry-After, as a download that cannot be staged answers, never "could not be parsed". A
full database disk is a 507 and stores no half set. An API killed mid-upload leaves nothing
in its temporary folder (the spool has no name). In each case a retry stores the set whole."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

from tests.service import fresh_service, kill_group
from tests.tmpfs import tmpfs


def _npz(mib: int) -> bytes:
    """An .npz of random digits, over `mib` MiB: past the 1 MiB a body is spooled in memory."""
    rng = np.random.default_rng(0)
    n = mib * 1400
    x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 2, n)
    buf = io.BytesIO()
    np.savez(buf, x_train=x[:-100], y_train=y[:-100], x_test=x[-100:], y_test=y[-100:])
    return buf.getvalue()


@contextlib.contextmanager
def small_tmpfs(folder: Path) -> Iterator[None]:
    """`folder` as a 4 MiB tmpfs, empty (a process that starts finds room there)."""
    with tmpfs(folder, "4m"):
        yield


def used(folder: Path) -> int:
    """Bytes the file system under `folder` holds."""
    st = os.statvfs(folder)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def fill(folder: Path) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={folder}/filler", "bs=4k"], capture_output=True)


def test_a_full_temporary_disk_answers_503_not_a_bad_upload(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with small_tmpfs(spool), fresh_service(tmp_path, None, {"TMPDIR": str(spool)}) as svc:
        key = {"Authorization": f"Bearer {svc.admin_key}"}
        data = _npz(2)

        def upload(name: str) -> httpx.Response:
            files = {"file": ("big.npz", data)}
            return httpx.post(
                f"{svc.url}/datasets", headers=key, files=files, data={"name": name}, timeout=60
            )

        first = upload("first")  # spooled there: the API's temporary folder is this one
        fill(spool)
        answer = upload("second")
        listed = httpx.get(f"{svc.url}/datasets", headers=key, timeout=10).json()
    assert first.status_code == 201, first.text
    assert answer.status_code == 503, answer.text
    assert "temporary folder is full" in answer.json()["detail"]
    assert answer.headers["Retry-After"]
    assert [d["name"] for d in listed] == ["first"]


def test_a_full_database_disk_stores_no_half_set_and_a_retry_does(tmp_path: Path) -> None:
    """The SQLite file's disk fills as an upload is stored: 507 naming it, no set listed;
    once space is freed, the same upload is stored whole."""
    disk = tmp_path / "db"
    with small_tmpfs(disk), fresh_service(tmp_path, None, api=False) as svc:
        svc.database_url = f"sqlite:///{disk / 'trainq.db'}"
        svc.migrate()
        svc.start_api()
        key = {"Authorization": f"Bearer {svc.admin_key}"}
        data = _npz(2)

        def upload() -> httpx.Response:
            files = {"file": ("big.npz", data)}
            return httpx.post(
                f"{svc.url}/datasets", headers=key, files=files, data={"name": "n"}, timeout=60
            )

        fill(disk)
        full = upload()
        listed = httpx.get(f"{svc.url}/datasets", headers=key, timeout=10).json()
        (disk / "filler").unlink()
        again = upload()
        after = httpx.get(f"{svc.url}/datasets", headers=key, timeout=10).json()
    assert full.status_code == 507, full.text
    assert listed == []
    assert again.status_code == 201, again.text
    assert [d["id"] for d in after] == [again.json()["id"]]


def test_an_api_killed_mid_upload_leaves_nothing_behind(tmp_path: Path) -> None:
    """kill -9 of the API while a body is being spooled: no file is left in its temporary
    folder (the spool has no name), no set is stored, and the restarted API takes the upload."""
    spool = tmp_path / "spool"
    with small_tmpfs(spool), fresh_service(tmp_path, None, {"TMPDIR": str(spool)}) as svc:
        key = {"Authorization": f"Bearer {svc.admin_key}"}
        data = _npz(2)
        boundary = "b0undary"
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nn\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d.npz"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        sent = threading.Event()

        def body() -> Iterator[bytes]:
            yield head + data[: len(data) // 2]
            sent.set()
            time.sleep(30)  # the API dies meanwhile
            yield data[len(data) // 2 :] + tail

        def post() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(
                    f"{svc.url}/datasets", content=body(), timeout=60,
                    headers={**key, "Content-Type": f"multipart/form-data; boundary={boundary}"},
                )  # fmt: skip

        sender = threading.Thread(target=post, daemon=True)
        sender.start()
        sent.wait(30)
        time.sleep(1)  # spooled past 1 MiB: on disk now
        assert svc.api is not None
        spooling = used(spool)
        kill_group(svc.api)
        left, freed = list(spool.iterdir()), used(spool)
        svc.start_api()
        files = {"file": ("d.npz", data)}
        again = httpx.post(
            f"{svc.url}/datasets", headers=key, files=files, data={"name": "n"}, timeout=60
        )
        listed = httpx.get(f"{svc.url}/datasets", headers=key, timeout=10).json()
    assert spooling > 1 << 20  # the half body was on that disk
    assert left == [] and freed < 64 << 10
    assert again.status_code == 201, again.text
    assert [d["id"] for d in listed] == [again.json()["id"]]

"""Model downloads a key leaves open and never reads hold a database connection each: past
download_max_per_key they are refused (429), and the other keys' requests go on."""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.db import Artifact, Database
from core.owners import owner_id
from core.store import new_job
from tests.service import RedisServer, Service

SPEC = {"dataset": "mnist-sample", "model": "mlp", "epochs": 1}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    (tmp_path / "data").mkdir()
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    svc = Service(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'trainq.db'}",
        redis=redis,
        log_dir=tmp_path,
        extra_env={"TRAINQ_DOWNLOAD_MAX_PER_KEY": "2"},
    )
    try:
        svc.migrate()
        svc.start_api()
        yield svc
    finally:
        svc.stop()
        redis.kill()


def succeeded_job(database_url: str, key: str, size: int) -> str:
    """A succeeded job of `key`'s with a model of `size` bytes, as a worker stores it."""
    data = os.urandom(size)
    job_id = str(uuid.uuid4())
    with Database(database_url).writer() as s:
        job = new_job(job_id=job_id, spec=SPEC, owner=owner_id(key), idempotency_key=None)
        job.status = "succeeded"
        s.add(job)
        s.flush()
        digest = hashlib.sha256(data).hexdigest()
        s.add(Artifact(job_id=job_id, format="torchscript", data=data, sha256=digest, size=size))
    return job_id


def stalled_download(port: int, key: str, job_id: str) -> socket.socket:
    """A download whose client reads its headers, then nothing more."""
    sock = socket.create_connection(("127.0.0.1", port))
    request = f"GET /jobs/{job_id}/model HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    sock.sendall(request.encode())
    assert sock.recv(12) == b"HTTP/1.1 200"
    return sock


def test_a_key_holds_no_more_downloads_open_than_its_limit(service: Service) -> None:
    alice, bob = service.keys
    mine = succeeded_job(service.database_url, alice, 32 << 20)  # past the sockets' buffers
    stalled = [stalled_download(service.port, alice, mine) for _ in range(2)]
    try:
        auth = {"Authorization": f"Bearer {alice}"}
        third = httpx.get(f"{service.url}/jobs/{mine}/model", headers=auth, timeout=30)
        assert third.status_code == 429, third.text[:200]
        assert third.json()["limit"] == "download_max_per_key"
        assert third.headers["Retry-After"]
        theirs = succeeded_job(service.database_url, bob, 1000)
        got = httpx.get(
            f"{service.url}/jobs/{theirs}/model",
            headers={"Authorization": f"Bearer {bob}"},
            timeout=30,
        )
        assert got.status_code == 200 and len(got.content) == 1000
    finally:
        for sock in stalled:
            sock.close()

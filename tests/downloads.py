"""Models stored as a worker stores them, and downloads whose clients stop reading."""

from __future__ import annotations

import hashlib
import os
import socket
import uuid

from core.db import Artifact, Database
from core.owners import owner_id
from core.store import new_job

SPEC = {"dataset": "mnist-sample", "model": "mlp", "epochs": 1}


def succeeded_job(database_url: str, key: str, size: int, sha256: str | None = None) -> str:
    """A succeeded job of `key`'s with a model of `size` bytes, as a worker stores it
    (`sha256`: another than its bytes', as storage that damaged them would hold)."""
    data = os.urandom(size)
    job_id = str(uuid.uuid4())
    db = Database(database_url)
    try:
        with db.writer() as s:
            job = new_job(job_id=job_id, spec=SPEC, owner=owner_id(key), idempotency_key=None)
            job.status = "succeeded"
            s.add(job)
            s.flush()
            digest = sha256 or hashlib.sha256(data).hexdigest()
            model = Artifact(job_id=job_id, format="torchscript", data=data, sha256=digest)
            model.size = size
            s.add(model)
    finally:
        db.dispose()
    return job_id


def stalled_download(port: int, key: str, job_id: str) -> socket.socket:
    """A download whose client reads its headers, then nothing more. Its receive buffer is
    small and fixed: loopback's may otherwise grow to take a whole model unread."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    sock.connect(("127.0.0.1", port))
    request = f"GET /jobs/{job_id}/model HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    sock.sendall(request.encode())
    assert sock.recv(12) == b"HTTP/1.1 200"
    return sock

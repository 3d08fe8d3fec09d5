"""One `trainq up` a data folder: it owns the folder's embedded Redis, and stops it when it
stops, so a second one there would be left on a Redis that is gone. The lock is an flock on
`<data_dir>/up.lock`, which the kernel releases when its holder dies, however it dies."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "up.lock"


class DataDirInUse(Exception):
    def __init__(self, data_dir: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "a process that is starting"
        super().__init__(
            f"the data folder {data_dir} is in use by another `trainq up` ({holder}): stop it "
            "first, or give this one a folder of its own (TRAINQ_DATA_DIR)"
        )
        self.pid = pid


def hold_data_dir(data_dir: Path) -> int:
    """Locks `data_dir` for this process until it ends (the lock's file descriptor is
    returned, and is not inherited by children), with this process's id written in the
    file; DataDirInUse, naming the holder, if another process holds it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        raise DataDirInUse(data_dir, pid) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None

"""Writing files that other processes read: whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(e: BaseException) -> bool:
    """Whether `e` (or what caused it) is a disk or a quota that was full."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            return True
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return False


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file beside it, flushed to disk, and a
    rename: a reader, a full disk or a power loss never leaves half a file at `path`, and
    processes sharing the folder (other hosts' included) may race safely. The file gets the
    mode a plain write would give it (the replaced file's, or 0666 less the umask), so that
    readers of another user still read it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _mode_for(path))
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # The rename itself survives a power loss once the folder is flushed; the file is in
    # place already, so a filesystem that cannot flush a folder is no failure.
    with contextlib.suppress(OSError):
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)  # read it: there is no call that only reads it
        os.umask(umask)
        return 0o666 & ~umask

"""What `Client.upload_dataset` sends: a file as it is, or a folder archived on the fly into
a temporary tar.gz (file by file, never the whole set in memory), read in chunks that report
their bytes to a progress callback. See docs/datasets.md ("From the CLI and the client")."""

from __future__ import annotations

import contextlib
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

# Called as the body is read out: (bytes of the file sent so far, the file's size).
Progress = Callable[[int, int], None]
SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".npz")
# The API's own bound (core.datasets.MAX_UPLOAD_BYTES; tests/unit/test_client_uploads.py
# holds the two together): a larger file is refused here, before 200 MiB are sent for a 413.
MAX_UPLOAD_BYTES = 200 << 20


class NotAnUpload(ValueError):
    """The path is neither a folder nor a file the API takes, or it is larger than the API
    takes: the message says what to give."""


class CountingReader:
    """A binary file whose reads report how far they are to `progress`; httpx reads it in
    chunks (and learns its length from its descriptor), so the body streams."""

    def __init__(self, f: IO[bytes], progress: Progress | None) -> None:
        self.f = f
        self.progress = progress
        self.size = os.fstat(f.fileno()).st_size

    def read(self, n: int = -1) -> bytes:
        chunk = self.f.read(n)
        if chunk and self.progress is not None:
            self.progress(self.f.tell(), self.size)
        return chunk

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()

    def fileno(self) -> int:
        return self.f.fileno()


def _archive_name(path: Path) -> str:
    return f"{path.resolve().name or 'photos'}.tar.gz"


@contextlib.contextmanager
def upload_file(path: Path) -> Iterator[tuple[str, IO[bytes]]]:
    """(the name sent, the open file): `path` itself, or a folder's tar.gz in a temporary
    file, deleted afterwards. The folder becomes the archive's one top folder, which the API
    drops; dot files are left out; a link is kept as a link, which the API skips and names."""
    if path.is_dir():
        with tempfile.TemporaryFile(prefix="trainq-upload-", suffix=".tar.gz") as tmp:
            with tarfile.open(fileobj=tmp, mode="w:gz", compresslevel=6) as tf:
                tf.add(path, arcname=path.resolve().name or "photos", filter=_no_dot_files)
            _check_size(path, tmp.tell())
            tmp.seek(0)
            yield _archive_name(path), tmp
        return
    if not path.is_file():
        raise NotAnUpload(f"{path}: no such file or folder")
    if not path.name.lower().endswith(SUFFIXES):
        raise NotAnUpload(
            f"{path}: give a folder of class folders, or a .zip, .tar.gz or .npz file"
        )
    _check_size(path, path.stat().st_size)
    with path.open("rb") as f:
        yield path.name, f


def _check_size(path: Path, size: int) -> None:
    if size > MAX_UPLOAD_BYTES:
        what = "archived, it is" if path.is_dir() else "it is"
        raise NotAnUpload(
            f"{path}: {what} {size / (1 << 20):,.1f} MiB: the API takes at most "
            f"{MAX_UPLOAD_BYTES >> 20} MiB an upload (resize the images first, or split the set)"
        )


def _no_dot_files(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Hidden files and folders (.DS_Store, .git) stay out; owners are not sent."""
    if any(part.startswith(".") for part in Path(info.name).parts):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def default_name(path: Path) -> str:
    """A set's name when none is given: the folder's or the file's, less its suffix."""
    name = path.resolve().name
    for suffix in SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)] or name
    return name or "photos"

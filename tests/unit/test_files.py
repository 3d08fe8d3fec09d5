from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from core.files import write_atomic


def test_a_write_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "train-images-idx3-ubyte"
    target.write_bytes(b"old")
    write_atomic(target, b"new" * 1000)
    assert target.read_bytes() == b"new" * 1000
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "set.npz"
    target.write_bytes(b"old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_the_file_gets_the_mode_a_plain_write_gives(tmp_path: Path) -> None:
    """Readers of another user (a worker reading a data folder root wrote) must read it."""
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    new = tmp_path / "new"
    write_atomic(new, b"x")
    assert new.stat().st_mode == plain.stat().st_mode
    os.chmod(plain, 0o640)
    write_atomic(plain, b"y")
    assert plain.stat().st_mode & 0o777 == 0o640

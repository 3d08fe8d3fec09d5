"""What `Client.upload_dataset` sends, without a service: a folder archived into a tar.gz
with one top folder (dot files left out, links kept as links for the API to name), a file
sent as it is, a path that is neither refused before anything is sent, and the body read in
chunks that report how far they are (httpx's own multipart encoder reading it)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import httpx
import pytest

from client.uploads import (
    MAX_UPLOAD_BYTES,
    CountingReader,
    NotAnUpload,
    default_name,
    upload_file,
)
from core import datasets


def test_a_folder_becomes_a_tar_gz_under_its_own_name(tmp_path: Path) -> None:
    folder = tmp_path / "pets"
    for path, blob in {"cat/0.jpg": b"cat", "cup/0.png": b"cup", "cup/.DS_Store": b"x",
                       ".git/config": b"y"}.items():  # fmt: skip
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(blob)
    os.symlink("/etc/passwd", folder / "cat" / "1.png")
    with upload_file(folder) as (name, f):
        assert name == "pets.tar.gz"
        with tarfile.open(fileobj=io.BytesIO(f.read()), mode="r:gz") as tf:
            files = {m.name: m for m in tf.getmembers() if not m.isdir()}
            assert set(files) == {"pets/cat/0.jpg", "pets/cup/0.png", "pets/cat/1.png"}
            assert files["pets/cat/1.png"].issym()  # sent as a link: the API skips and names it
            assert tf.extractfile(files["pets/cup/0.png"]).read() == b"cup"  # type: ignore[union-attr]
            assert {m.uname for m in files.values()} == {""}


def test_a_file_is_sent_as_it_is_and_anything_else_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "pets.tar.gz"
    archive.write_bytes(b"bytes")
    with upload_file(archive) as (name, f):
        assert (name, f.read()) == ("pets.tar.gz", b"bytes")
    (tmp_path / "notes.txt").write_text("hello")
    for path, why in (("notes.txt", "give a folder of class folders"),
                      ("missing", "no such file or folder")):  # fmt: skip
        with pytest.raises(NotAnUpload, match=why), upload_file(tmp_path / path):
            pass


@pytest.mark.parametrize(
    ("name", "expected"),
    [("pets.tar.gz", "pets"), ("pets.ZIP", "pets"), ("digits.npz", "digits"), ("photos", "photos")],
)
def test_the_default_name(tmp_path: Path, name: str, expected: str) -> None:
    assert default_name(tmp_path / name) == expected


def test_the_body_streams_in_chunks_that_report_progress(tmp_path: Path) -> None:
    path = tmp_path / "big.zip"
    path.write_bytes(os.urandom(1 << 20))
    heard: list[tuple[int, int]] = []
    with path.open("rb") as f:
        reader = CountingReader(f, lambda sent, size: heard.append((sent, size)))
        request = httpx.Request("POST", "http://api.invalid/datasets", files={"file": reader})
        assert int(request.headers["content-length"]) > 1 << 20  # known up front: not chunked
        chunks = [len(c) for c in request.stream]  # type: ignore[union-attr]
    assert max(chunks) <= 64 << 10 and len(heard) == 16
    assert [s for s, _ in heard] == sorted(s for s, _ in heard)
    assert heard[-1] == (1 << 20, 1 << 20)


def test_a_file_larger_than_the_api_takes_is_refused_before_sending(tmp_path: Path) -> None:
    assert MAX_UPLOAD_BYTES == datasets.MAX_UPLOAD_BYTES
    path = tmp_path / "big.zip"
    with path.open("wb") as f:
        f.truncate(MAX_UPLOAD_BYTES + 1)  # sparse: no disk used
    too_large = pytest.raises(NotAnUpload, match="the API takes at most 200 MiB an upload")
    with too_large, upload_file(path):
        pass
    with path.open("wb") as f:
        f.truncate(MAX_UPLOAD_BYTES)
    with upload_file(path) as (name, _):
        assert name == "big.zip"

"""Only the compressions and member types docs/datasets.md promises are read: zip members
stored or deflated, tars plain or gzipped; every other compression, and sparse tar members
(whose maps tarfile reads with no bound), refused by name before anything is expanded."""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile

import pytest

from api.uploads import parse_upload
from core.errors import InvalidDataset
from tests.memory import peak_growth_mib
from tests.uploads import (
    bz2_tar_bomb,
    image,
    lying_bz2_zip,
    old_gnu_sparse_tar,
    pax_sparse_tar,
    zip_bytes,
)

PHOTOS = {f"{k}/{i}.png": image("L", (8, 8), 40 * i) for k in "ab" for i in range(1, 6)}


def tar_of(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def own_peak(act: object) -> int:
    import os

    _, growth = peak_growth_mib(os.getpid(), act)  # type: ignore[arg-type]
    return growth


def test_a_bzip2_tar_is_refused_by_name_before_any_of_it_is_expanded() -> None:
    bomb = bz2_tar_bomb()
    assert len(bomb) < 1024

    def parse() -> None:
        with pytest.raises(InvalidDataset, match="compressed with bzip2: trainq reads a zip"):
            parse_upload(bomb)

    assert own_peak(parse) < 16  # MiB: its 64 MiB were never expanded


@pytest.mark.parametrize(
    ("magic", "name"),
    [(b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\x5d\x00\x00", "lzma")],
    ids=["xz", "zstd", "lzma"],
)
def test_other_tar_compressions_are_refused_by_name(magic: bytes, name: str) -> None:
    with pytest.raises(InvalidDataset, match=f"compressed with {name}"):
        parse_upload(magic + bytes(600))


def test_a_zip_member_of_another_method_than_deflate_is_refused_before_it_is_read() -> None:
    bomb = lying_bz2_zip()

    def parse() -> None:
        with pytest.raises(
            InvalidDataset, match=r"'a/0.png' is compressed with method 12 \(bzip2\)"
        ):
            parse_upload(bomb)

    assert own_peak(parse) < 16


def test_a_zip_of_lzma_members_is_refused() -> None:
    with pytest.raises(InvalidDataset, match=r"method 14 \(lzma\)"):
        parse_upload(zip_bytes(PHOTOS, compression=zipfile.ZIP_LZMA))


def test_plain_and_gzipped_tars_and_stored_zips_are_read() -> None:
    plain = tar_of(PHOTOS)
    for blob in (plain, gzip.compress(plain), zip_bytes(PHOTOS, zipfile.ZIP_STORED)):
        assert parse_upload(blob).classes == ("a", "b")


def test_an_old_gnu_sparse_member_is_refused_before_its_chain_is_read() -> None:
    with pytest.raises(InvalidDataset, match=r"'a/0\.png' is a sparse file"):
        parse_upload(old_gnu_sparse_tar(blocks=5_000))


def test_a_pax_sparse_member_is_refused_before_its_map_is_read() -> None:
    with pytest.raises(InvalidDataset, match=r"'a/0\.png' is a sparse file"):
        parse_upload(pax_sparse_tar())


def test_a_gzipped_sparse_tar_is_refused_too() -> None:
    with pytest.raises(InvalidDataset, match="is a sparse file"):
        parse_upload(gzip.compress(old_gnu_sparse_tar(blocks=50)))

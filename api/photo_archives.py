"""The members of an uploaded archive of photos, zip or tar (plain or gzipped: no other
compression is read), behind the guards: counts and sizes before anything is expanded,
nothing expanding over MAX_RATIO times, no absolute path or '..', no name that is not plain
text, no sparse member (whose maps tarfile reads unbounded); links (symlinks, hard links)
and other non-files are skipped and named. See docs/datasets.md ("Photos")."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from core import datasets
from core.datasets import check_ratio, checked_members, read_member
from core.errors import DatasetTooLarge, InvalidDataset
from core.text import PLAIN_MESSAGE, is_plain

TAR_HEADER = 512  # bytes a tar member's header takes
MAX_NAME = 1024  # characters in a member's path: a longer one is no photo's
# A tar's extended headers (GNU long names and links, pax records) hold a name or a few
# fields; tarfile reads one whole into memory before any check of ours could see it.
MAX_EXTENDED_HEADER = 64 << 10
_EXTENDED = {tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
             tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE}  # fmt: skip
GZIP_MAGIC = b"\x1f\x8b"
# Compressions a tar may come in that trainq does not read: their decoders expand a whole
# block with no bound on what comes out.
_OTHER_COMPRESSIONS = {b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x5d\x00\x00": "lzma",
                       b"\x28\xb5\x2f\xfd": "zstd", b"\x1f\x9d": "compress (.Z)"}  # fmt: skip
SPARSE_REFUSED = (
    "is a sparse file (GNU sparse): trainq reads regular files only; archive it again "
    "without --sparse"
)


@dataclass(frozen=True)
class Member:
    name: str  # as the archive spells it
    parts: tuple[str, ...]
    read: Callable[[], bytes]


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str


class _BoundedInfo(tarfile.TarInfo):
    """A member whose extended header is refused, unread, past MAX_EXTENDED_HEADER."""

    def _proc_member(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED and self.size > MAX_EXTENDED_HEADER:
            raise DatasetTooLarge(
                f"a member's extended header (a long name or pax record) is {self.size} "
                f"bytes: at most {MAX_EXTENDED_HEADER}"
            )
        return super()._proc_member(tf)  # type: ignore[misc,no-any-return]

    # Sparse members, old GNU and pax alike: refused before their maps are read (an old GNU
    # member's chain of extension blocks, or a pax 1.0 map, has no bound of its own).
    def _proc_sparse(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
        raise InvalidDataset(f"archive member {quoted(self.name)} {SPARSE_REFUSED}")

    def _proc_gnusparse_00(self, next: tarfile.TarInfo, *_: object) -> None:
        raise InvalidDataset(f"archive member {quoted(next.name)} {SPARSE_REFUSED}")

    _proc_gnusparse_01 = _proc_gnusparse_10 = _proc_gnusparse_00


def _open_tar(data: bytes) -> tarfile.TarFile:
    """The tar as one stream, plain or gzipped; any other compression refused by name."""
    for magic, name in _OTHER_COMPRESSIONS.items():
        if data.startswith(magic):
            raise InvalidDataset(
                f"the archive is compressed with {name}: trainq reads a zip (stored or deflate), "
                "a plain tar or a tar.gz; compress it again with gzip"
            )
    fileobj = io.BytesIO(data)
    if data.startswith(GZIP_MAGIC):
        return tarfile.open(fileobj=fileobj, mode="r|gz", tarinfo=_BoundedInfo)
    return tarfile.open(fileobj=fileobj, mode="r|", tarinfo=_BoundedInfo)


def is_tar(data: bytes) -> bool:
    """Whether `data` is a tar (plain or gzipped); InvalidDataset for another compression."""
    for magic in _OTHER_COMPRESSIONS:
        if data.startswith(magic):
            _open_tar(data)  # raises, naming the compression
    try:
        with _open_tar(data) as tf:
            return tf.next() is not None
    except InvalidDataset:  # DatasetTooLarge too
        return True  # a tar, refused when its members are read
    except (tarfile.TarError, OSError, EOFError):
        return False


def quoted(name: str, limit: int = 120) -> str:
    """A member's name as a message quotes it: cut short past `limit` characters."""
    return repr(name if len(name) <= limit else name[:limit] + "...")


def _parts(name: str) -> tuple[str, ...]:
    """The path's parts, refused if absolute, climbing with '..' or not plain text."""
    if len(name) > MAX_NAME:
        raise InvalidDataset(
            f"archive member {quoted(name)}: a path of {len(name)} characters, at most {MAX_NAME}"
        )
    path = name.replace("\\", "/")
    parts = tuple(p for p in path.split("/") if p not in ("", "."))
    if path.startswith("/") or (len(name) > 1 and name[1] == ":") or ".." in parts:
        raise InvalidDataset(f"archive member {name!r}: absolute paths and '..' are refused")
    return parts


def _ignored(parts: tuple[str, ...]) -> bool:
    return not parts or parts[0] == "__MACOSX" or any(p.startswith(".") for p in parts)


def _check_file_name(name: str, parts: tuple[str, ...]) -> None:
    if not is_plain(parts[-1]):
        raise InvalidDataset(f"archive member {name!r}: its file name is not plain text: "
                             f"{PLAIN_MESSAGE}")  # fmt: skip


def zip_members(zf: zipfile.ZipFile) -> tuple[list[Member], list[Skipped]]:
    """The zip's files (core.datasets.checked_members' guards), links skipped and named."""
    members, skipped = [], []
    for info in checked_members(zf):
        parts = _parts(info.filename)
        if _ignored(parts):
            continue
        if stat.S_ISLNK(info.external_attr >> 16):
            skipped.append(Skipped(info.filename, "a symbolic link: links are not followed"))
            continue
        _check_file_name(info.filename, parts)
        members.append(Member(info.filename, parts, partial(read_member, zf, info)))
    return members, skipped


def tar_members(data: bytes) -> tuple[list[Member], list[Skipped]]:
    """The tar's regular files, read as one stream: members counted, each one's declared
    size added up before it is read (at most MAX_UNCOMPRESSED_BYTES, and MAX_RATIO times
    the upload), links and devices skipped and named."""
    members: list[Member] = []
    skipped: list[Skipped] = []
    count = 0
    with _open_tar(data) as tf:
        for info in tf:
            count += 1
            if count > datasets.MAX_MEMBERS:
                raise DatasetTooLarge(f"the archive has over {datasets.MAX_MEMBERS} members")
            # Where its data starts in the expanded stream: every header before it counted.
            expanded = info.offset_data + max(info.size, 0)
            _check_expanded(expanded, len(data))
            parts = _parts(info.name)
            if _ignored(parts) or info.isdir():
                continue
            if info.issym() or info.islnk():
                kind = "a symbolic link" if info.issym() else "a hard link"
                skipped.append(Skipped(info.name, f"{kind}: links are not followed"))
                continue
            if not info.isfile():
                skipped.append(Skipped(info.name, "not a regular file"))
                continue
            _check_file_name(info.name, parts)
            members.append(Member(info.name, parts, partial(bytes, _read(tf, info))))
    return members, skipped


def _check_expanded(expanded: int, packed: int) -> None:
    if expanded > datasets.MAX_UNCOMPRESSED_BYTES:
        raise DatasetTooLarge(
            f"the archive holds over {expanded} bytes uncompressed: at most "
            f"{datasets.MAX_UNCOMPRESSED_BYTES} (1 GiB)"
        )
    check_ratio(expanded, packed, "the archive")


def _read(tf: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    f = tf.extractfile(info)
    if f is None:
        raise InvalidDataset(f"archive member {info.name!r} could not be read")
    out = f.read(info.size + 1)
    if len(out) != info.size:
        raise InvalidDataset(f"archive member {info.name!r} is not the size its header says")
    return out

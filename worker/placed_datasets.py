"""The copies of uploaded data sets a worker host placed (worker.dataset_files), kept only
while their sets exist: a set's deletion runs on the API's host, and a write that a crash
(kill -9) cut short leaves its temporary file (core.files.write_atomic) beside the copies.
The reconciling pass (worker.reconciler) takes both away, so neither fills the host's disk.
Light: the API's reconciler runs it too."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from sqlalchemy import select

from core.db import Database, UserDataset
from core.spec import USER_DATASETS

# A temporary file untouched this long was left by a writer that died: the write of the
# largest set takes minutes, not an hour (workers on other hosts may share the folder).
CUT_WRITE_S = 3600.0
LOOKUP = 500  # copies whose sets are looked up in one query


def prune_placed(db: Database, data_dir: Path) -> int:
    """This host's copies of sets deleted since (a deletion waits until no queued or running
    job trains on the set, so no job reads the copy), and the temporary files of writes cut
    short CUT_WRITE_S ago. How many files went."""
    folder = data_dir.joinpath(*USER_DATASETS)
    if not folder.is_dir():
        return 0
    copies: dict[str, Path] = {}
    gone = 0
    for path in folder.iterdir():
        if path.name.startswith(".") and path.name.endswith(".tmp"):
            gone += _remove_if_older(path, CUT_WRITE_S)
        elif path.suffix == ".npz":
            copies[path.stem] = path
    if not copies:
        return gone
    ids, there = sorted(copies), set()
    with db.reader() as s:
        for i in range(0, len(ids), LOOKUP):
            chunk = ids[i : i + LOOKUP]
            there |= set(s.scalars(select(UserDataset.id).where(UserDataset.id.in_(chunk))))
    for ds_id in copies.keys() - there:
        copies[ds_id].unlink(missing_ok=True)
        gone += 1
    return gone


def _remove_if_older(path: Path, age_s: float) -> int:
    with contextlib.suppress(FileNotFoundError):  # renamed by its writer meanwhile
        if time.time() - path.stat().st_mtime > age_s:
            path.unlink()
            return 1
    return 0

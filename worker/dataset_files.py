"""Uploaded data sets, placed on the worker host as the files the trainer reads.
See docs/datasets.md."""

from __future__ import annotations

import hashlib
from pathlib import Path

from core.db import Database, UserDataset
from core.errors import DatasetNotFound
from core.files import write_atomic
from core.spec import user_dataset_id
from core.store import dataset_data
from core.train.data import user_dataset_path
from core.train.kept_data import KEPT


def place_dataset(db: Database, data_dir: Path, name: str) -> None:
    """An uploaded data set ("ds:<id>") goes from the database to the file the trainer reads
    (core.train.data.user_dataset_path), once per worker host: written atomically, and
    rewritten if a file is there but is not the stored one."""
    ds_id = user_dataset_id(name)
    if ds_id is None:
        return
    path = user_dataset_path(name, data_dir)
    with db.writer() as s:
        if path.exists():
            row = s.get(UserDataset, ds_id)
            known = KEPT.file_sha256(name, data_dir)  # as its worker read it: not hashed again
            if row is not None and (known or _sha256(path)) == row.sha256:
                return
        found = dataset_data(s, dataset_id=ds_id)
    if found is None:
        raise DatasetNotFound(f"data set {name!r} does not exist (it was never uploaded)")
    sha256, blob = found
    if hashlib.sha256(blob).hexdigest() != sha256:
        raise DatasetNotFound(f"data set {name!r}: the stored copy failed its sha256 check")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, blob)  # workers sharing a data folder may race; none sees half a file


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

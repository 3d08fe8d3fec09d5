"""A stored model copied out of the database in one short read into an unnamed file,
sha256-checked, so a download holds nothing in the database while it is sent.
See docs/jobs.md."""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sqlalchemy import func, literal_column, select
from sqlalchemy.orm import Session

from core.db import Artifact, Database
from core.errors import ModelDamaged

log = logging.getLogger("trainq.store")
CHUNK_BYTES = 1 << 20


@dataclass
class ModelCopy:
    """One format of a job's model, in a file of its own that is gone once closed."""

    file: IO[bytes]
    sha256: str
    size: int

    def chunks(self) -> Iterator[bytes]:
        self.file.seek(0)
        while chunk := self.file.read(CHUNK_BYTES):
            yield chunk

    def close(self) -> None:
        self.file.close()


def copy_model(db: Database, *, job_id: str, format: str, folder: Path) -> ModelCopy | None:
    """The model, copied into an unnamed file in `folder` (O_TMPFILE where the system has
    it, else unlinked at once), or None if the job has none in `format`. ModelDamaged if
    its bytes are not those its sha256 and size describe."""
    blob = ModelBlob.open(db, job_id=job_id, format=format)
    if blob is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    file = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115 (closed by its download)
    try:
        for chunk in blob.chunks():
            file.write(chunk)
        file.flush()
    except BaseException:
        file.close()
        raise
    finally:
        blob.close()
    return ModelCopy(file, blob.sha256, blob.size)


class ModelBlob:
    """One format of a job's model, open for reading in one snapshot: its sha256 and size,
    then its bytes (`chunks`, once). Holds its session until it is closed."""

    def __init__(self, s: Session, *, job_id: str, format: str, sha256: str, size: int) -> None:
        self._s = s
        self.job_id, self.format = job_id, format
        self.sha256, self.size = sha256, size
        self._blob: Any = None  # SQLite's open blob handle

    @classmethod
    def open(cls, db: Database, *, job_id: str, format: str) -> ModelBlob | None:
        """The model, or None if the job has none in `format` (in this snapshot)."""
        s = db.snapshot()
        try:
            row = s.execute(
                select(Artifact.sha256, Artifact.size).where(
                    Artifact.job_id == job_id, Artifact.format == format
                )
            ).one_or_none()
        except BaseException:
            s.close()
            raise
        if row is None:
            s.close()
            return None
        return cls(s, job_id=job_id, format=format, sha256=row.sha256, size=row.size)

    def close(self) -> None:
        if self._blob is not None:
            self._blob.close()
            self._blob = None
        self._s.close()

    def chunks(self) -> Iterator[bytes]:
        """The bytes, CHUNK_BYTES at a time, then ModelDamaged if they were not those the
        row's sha256 and size describe."""
        digest = hashlib.sha256()
        offset = 0
        while offset < self.size:
            chunk = self._read(offset, min(CHUNK_BYTES, self.size - offset))
            if not chunk:
                raise self._damaged(f"is shorter than its {self.size} bytes")
            digest.update(chunk)
            offset += len(chunk)
            yield chunk
        if offset != self.size or digest.hexdigest() != self.sha256:
            raise self._damaged("failed its sha256 check")

    def _damaged(self, why: str) -> ModelDamaged:
        what = f"the stored {self.format} model of job {self.job_id}"
        log.error("%s %s", what, why)
        return ModelDamaged(
            f"{what} {why}: it was damaged in storage and cannot be sent; an operator can "
            "look at the database, and the job can be trained again"
        )

    def _read(self, offset: int, length: int) -> bytes:
        if self._s.get_bind().dialect.name == "sqlite":
            return self._read_sqlite(offset, length)
        # PostgreSQL fetches only the TOAST chunks of the slice (a model is stored
        # uncompressed: pglz gives up on weights).
        data = self._s.scalar(
            select(func.substring(Artifact.data, offset + 1, length)).where(
                Artifact.job_id == self.job_id, Artifact.format == self.format
            )
        )
        return bytes(data or b"")

    def _read_sqlite(self, offset: int, length: int) -> bytes:
        """SQLite's substr() loads the whole value at every call; its incremental blob I/O
        reads only the pages asked for, within this session's read transaction. One handle
        for the whole read: it keeps the list of the value's pages, found once."""
        if self._blob is None:
            rowid = self._s.scalar(
                select(literal_column("rowid")).select_from(Artifact.__table__)
                .where(Artifact.job_id == self.job_id, Artifact.format == self.format)
            )  # fmt: skip
            if rowid is None:
                return b""
            raw: Any = self._s.connection().connection.dbapi_connection
            self._blob = raw.blobopen("artifacts", "data", rowid, readonly=True)
        self._blob.seek(offset)
        return bytes(self._blob.read(length))

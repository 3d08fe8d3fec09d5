"""A stored model read in chunks, so that a download holds one chunk in memory whatever the
model's size. Every chunk comes from one snapshot (Database.snapshot): a job deleted or
purged while its model downloads still sends the model it had, whole."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from typing import Any

from sqlalchemy import func, literal_column, select
from sqlalchemy.orm import Session

from core.db import Artifact, Database

log = logging.getLogger("trainq.store")
CHUNK_BYTES = 1 << 20


class StoredModelCorrupt(Exception):
    """The bytes read are not those the row's sha256 and size describe."""


class ModelBlob:
    """One format of a job's model, open for reading: its sha256 and size, then its bytes
    (`chunks`, once). Holds its session until the chunks are read or it is closed."""

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
        """The bytes, CHUNK_BYTES at a time. The last chunk is held back until the whole
        has matched its sha256: a model damaged in storage never arrives whole (the
        response is cut short of its Content-Length)."""
        try:
            digest = hashlib.sha256()
            offset = 0
            while offset < self.size:
                chunk = self._read(offset, min(CHUNK_BYTES, self.size - offset))
                if not chunk:
                    raise StoredModelCorrupt(f"shorter than its {self.size} bytes")
                digest.update(chunk)
                offset += len(chunk)
                if offset >= self.size and digest.hexdigest() != self.sha256:
                    raise StoredModelCorrupt("failed its sha256 check")
                yield chunk
        except StoredModelCorrupt as e:
            log.error("stored model of job %s (%s) %s", self.job_id, self.format, e)
            raise
        finally:
            self.close()

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

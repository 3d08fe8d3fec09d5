"""The data-set calls of the HTTP client (client.http.Client has them all): upload a set
(a file as it is, or a folder archived on the fly: client.uploads), read one, list them.
See docs/datasets.md ("From the CLI and the client")."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any, cast

import httpx

from client.ids import WHOLE_ID, IdNotFound
from client.registry import Calls
from client.uploads import CountingReader, Progress, default_name, upload_file

# An upload's answer comes once the API has checked every image: minutes for a large set.
UPLOAD_READ_TIMEOUT = 900.0


class DatasetCalls:
    def upload_dataset(
        self: Calls,
        path: str | Path,
        *,
        name: str | None = None,
        image_size: int | None = None,
        fit: str | None = None,
        val_fraction: float | None = None,
        skip_bad: bool = False,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Upload a data set: a .zip, .tar.gz or .npz file, or a folder of class folders
        (archived on the fly into a temporary tar.gz). `progress(n)` hears each chunk's n
        bytes as it is sent. The answer is the set as `dataset(id)` shows it; a refusal is
        an ApiError (422 naming what was wrong, 413 past a bound)."""
        path = Path(path)
        fields = {
            "name": name or default_name(path),
            "image_size": image_size,
            "fit": fit,
            "val_fraction": val_fraction,
            "skip_bad": "true" if skip_bad else None,
        }
        data = {k: str(v) for k, v in fields.items() if v is not None}
        timeout = httpx.Timeout(self.http.timeout.connect, read=UPLOAD_READ_TIMEOUT)
        with upload_file(path) as (sent_as, f):
            reader = cast(IO[bytes], CountingReader(f, progress))  # read, seek, tell, fileno
            file = (sent_as, reader, "application/octet-stream")
            resp = self.http.post("/datasets", data=data, files={"file": file}, timeout=timeout)
        return self._object(resp)

    def dataset(self: Calls, dataset_id: str) -> dict[str, Any]:
        """One data set (its id, or `ds:<id>`): classes, counts, mean/std, preprocessing."""
        given = dataset_id.strip().lower().removeprefix("ds:")
        if not WHOLE_ID.match(given):
            raise IdNotFound(f"{dataset_id!r} is not a data set id (a uuid, or ds:<uuid>)")
        return self._object(self.http.get(f"/datasets/{given}"))

    def datasets(self: Calls) -> list[dict[str, Any]]:
        """The key's data sets, newest first (an admin key: everyone's)."""
        return cast(list[dict[str, Any]], self._json(self.http.get("/datasets")))

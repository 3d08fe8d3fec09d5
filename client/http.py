"""A small Python client for trainq's HTTP API (used by the `trainq` CLI): `Client` submits,
lists, follows (Server-Sent Events, resumed after a disconnect), cancels, deletes and
downloads jobs (sha256-checked), and reads sweeps, data sets and quotas. See docs/queue.md
("Through the HTTP API") and docs/api.md."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import httpx

from client.uploads import CountingReader, Progress, default_name, upload_file
from core.spec import TERMINAL

WHOLE_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIN_ID_PREFIX = 4  # the API's own minimum (api.access.IdPrefix)
ID_PREFIX = re.compile(rf"^[0-9a-f-]{{{MIN_ID_PREFIX},36}}$")
CANDIDATES_SHOWN = 5  # of an ambiguous prefix
# The most a download writes: a server that is not trainq's could send an endless body.
MAX_DOWNLOAD_BYTES = 2 << 30
# An upload's answer comes once the API has checked every image: minutes for a large set.
UPLOAD_READ_TIMEOUT = 900.0
SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Downloaded:
    """A model written to disk: its sha256, and whether the API sent one (its ETag) that
    the bytes were checked against."""

    sha256: str
    verified: bool


class IdNotFound(LookupError):
    """No job (or sweep) of the key's has an id that starts so, or several have: the
    message says which, and what to give instead."""


class ApiError(Exception):
    """`body`: the whole JSON answer (a 429 past a quota names its limit and usage there);
    `retry_after`: the Retry-After header, where the API sent one."""

    def __init__(
        self,
        status: int,
        detail: Any,
        body: dict[str, Any] | None = None,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.body = body or {}
        self.retry_after = retry_after


class Client:
    def __init__(self, base_url: str, api_key: str, timeout: float = 30.0) -> None:
        self.http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _json(self, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = None
            detail = body.get("detail") if isinstance(body, dict) else resp.text
            raise ApiError(
                resp.status_code,
                detail,
                body if isinstance(body, dict) else None,
                resp.headers.get("retry-after"),
            )
        return resp.json()

    def _object(self, resp: httpx.Response) -> dict[str, Any]:
        """The JSON object that every route but /epochs answers."""
        return cast(dict[str, Any], self._json(resp))

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._object(self.http.post("/jobs", json=spec, headers=headers))

    def find_job_id(self, given: str) -> str:
        """The whole id of the key's job whose id is `given` or starts with it (as git and
        docker take a prefix); IdNotFound for none or several."""
        return whole_id(
            "job", given, lambda prefix: self.jobs(id_prefix=prefix, limit=CANDIDATES_SHOWN + 1)
        )

    def find_sweep_id(self, given: str) -> str:
        """find_job_id's twin, for sweeps."""
        return whole_id(
            "sweep", given, lambda prefix: self.sweeps(id_prefix=prefix, limit=CANDIDATES_SHOWN + 1)
        )

    def job(self, job_id: str) -> dict[str, Any]:
        return self._object(self.http.get(f"/jobs/{job_id}"))

    def jobs(
        self,
        status: str | None = None,
        limit: int = 50,
        sweep_id: str | None = None,
        id_prefix: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every job (of one sweep, with `sweep_id`; whose id starts with `id_prefix`),
        newest first, following the cursors."""
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if sweep_id:
            params["sweep_id"] = sweep_id
        if id_prefix:
            params["id_prefix"] = id_prefix
        return self._pages("/jobs", params)

    def metrics(self, job_id: str, after: int = 0, limit: int = 1000) -> dict[str, Any]:
        return self._object(
            self.http.get(f"/jobs/{job_id}/metrics", params={"after": after, "limit": limit})
        )

    def epochs(self, job_id: str) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._json(self.http.get(f"/jobs/{job_id}/epochs")))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._object(self.http.post(f"/jobs/{job_id}/cancel"))

    def delete(self, job_id: str) -> None:
        """Delete an ended job and all it stored (ApiError 409 while it is queued or running)."""
        resp = self.http.delete(f"/jobs/{job_id}")
        if resp.status_code != 204:
            self._json(resp)

    def record(self, job_id: str) -> dict[str, Any]:
        return self._object(self.http.get(f"/jobs/{job_id}/record"))

    def confusion(self, job_id: str, epoch: int | None = None) -> dict[str, Any]:
        """An epoch's confusion matrix and per-class accuracy, with the class names; the
        last epoch's without `epoch`."""
        params = {} if epoch is None else {"epoch": epoch}
        return self._object(self.http.get(f"/jobs/{job_id}/confusion", params=params))

    def predict(
        self, job_id: str, images: list[str | Path | bytes], k: int | None = None
    ) -> dict[str, Any]:
        """The job's model on image files (paths, or their bytes): per image its `label`
        and the `k` most probable labels with their probabilities (`top`)."""
        files = [
            ("files", (f"image{i}", im if isinstance(im, bytes) else Path(im).read_bytes()))
            for i, im in enumerate(images)
        ]
        params = {} if k is None else {"k": k}
        return self._object(
            self.http.post(f"/jobs/{job_id}/predict", files=files, params=params, timeout=120)
        )

    def usage(self) -> dict[str, Any]:
        """The key's limits and what it uses of them (`caller`); for an admin key, every
        owner's too (`owners`)."""
        return self._object(self.http.get("/usage"))

    def quotas(self) -> dict[str, Any]:
        """Admin: the default limits and every owner's overrides."""
        return self._object(self.http.get("/quotas"))

    def set_quota(self, owner: str, limits: dict[str, Any]) -> dict[str, Any]:
        """Admin: replace `owner`'s overrides (None: no limit; a limit left out: the default)."""
        return self._object(self.http.put(f"/quotas/{owner}", json=limits))

    def clear_quota(self, owner: str) -> dict[str, Any]:
        """Admin: `owner` back to the default limits."""
        return self._object(self.http.delete(f"/quotas/{owner}"))

    def create_sweep(
        self, sweep: dict[str, Any], idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Start a sweep: {"base": JobSpec, "space": {...}, "objective", "sampler", "pruner",
        "trials", "parallel"}; its first trials are queued at once."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._object(self.http.post("/sweeps", json=sweep, headers=headers))

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        return self._object(self.http.get(f"/sweeps/{sweep_id}"))

    def sweeps(self, limit: int = 20, id_prefix: str | None = None) -> Iterator[dict[str, Any]]:
        """Every sweep (whose id starts with `id_prefix`), newest first."""
        params: dict[str, Any] = {"limit": limit}
        if id_prefix:
            params["id_prefix"] = id_prefix
        return self._pages("/sweeps", params)

    def upload_dataset(
        self,
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

    def dataset(self, dataset_id: str) -> dict[str, Any]:
        """One data set (its id, or `ds:<id>`): classes, counts, mean/std, preprocessing."""
        given = dataset_id.strip().lower().removeprefix("ds:")
        if not WHOLE_ID.match(given):
            raise IdNotFound(f"{dataset_id!r} is not a data set id (a uuid, or ds:<uuid>)")
        return self._object(self.http.get(f"/datasets/{given}"))

    def datasets(self) -> list[dict[str, Any]]:
        """The key's data sets, newest first (an admin key: everyone's)."""
        return cast(list[dict[str, Any]], self._json(self.http.get("/datasets")))

    def _pages(self, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Every item of a listing, page after page, following its cursors."""
        while True:
            page = self._object(self.http.get(path, params=params))
            yield from page["items"]
            if not page["next"]:
                return
            params = {**params, "cursor": page["next"]}

    def cancel_sweep(self, sweep_id: str) -> dict[str, Any]:
        return self._object(self.http.post(f"/sweeps/{sweep_id}/cancel"))

    def sweep_events(self, sweep_id: str) -> Iterator[dict[str, Any]]:
        """The sweep each time it changes, until it ends; a dropped connection reconnects
        (each event is the whole sweep, so nothing is missed)."""
        while True:
            try:
                with self.http.stream("GET", f"/sweeps/{sweep_id}/events", timeout=None) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        self._json(resp)
                    for event in _parse_sse(resp.iter_lines()):
                        yield event["data"]
                        if event["data"]["status"] != "running":
                            return
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError):
                time.sleep(0.5)
            except ApiError as e:
                if e.status != 503:
                    raise
                time.sleep(0.5)

    def health(self) -> dict[str, Any]:
        return self._object(self.http.get("/health"))

    def events(self, job_id: str, last_event_id: str | None = None) -> Iterator[dict[str, Any]]:
        """Follow the job's Server-Sent Events until it ends; reconnects resume where the
        last event left off. Each item: {"id", "event", "data"}."""
        while True:
            headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
            try:
                with self.http.stream(
                    "GET", f"/jobs/{job_id}/events", headers=headers, timeout=None
                ) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        self._json(resp)
                    for event in _parse_sse(resp.iter_lines()):
                        last_event_id = event["id"]
                        yield event
                        if event["event"] == "status" and event["data"].get("status") in TERMINAL:
                            return
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError):
                time.sleep(0.5)  # the API restarted or the connection dropped: resume
            except ApiError as e:
                if e.status != 503:
                    raise
                time.sleep(0.5)  # Redis or the database away for a moment

    def download(
        self,
        job_id: str,
        path: Path,
        format: str | None = None,
        max_bytes: int = MAX_DOWNLOAD_BYTES,
    ) -> Downloaded:
        """Stream the model in `format` (torchscript, pt2 or onnx; by default the job's
        `default_format`) to `path`, checking its sha256 against the ETag where the API
        sent one. A body past `max_bytes` is refused; nothing is left at `path` then, nor
        when the sha256 differs."""
        tmp = path.with_suffix(path.suffix + ".part")
        try:
            sha256, expected = self._stream_model(job_id, tmp, format, max_bytes)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if expected is not None and sha256 != expected:
            tmp.unlink(missing_ok=True)
            raise ApiError(502, f"downloaded model's sha256 {sha256} != {expected}")
        tmp.replace(path)
        return Downloaded(sha256, verified=expected is not None)

    def _stream_model(
        self, job_id: str, tmp: Path, format: str | None, max_bytes: int
    ) -> tuple[str, str | None]:
        """The body written to `tmp`: its sha256, and the one the ETag gives (or None)."""
        digest, size = hashlib.sha256(), 0
        params = {"format": format} if format else {}
        with self.http.stream("GET", f"/jobs/{job_id}/model", params=params) as resp:
            if resp.status_code >= 400:
                resp.read()
                self._json(resp)
            etag = resp.headers.get("etag", "").strip('"')
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise ApiError(502, f"the model is {declared} bytes: more than {max_bytes} bytes")
            with tmp.open("wb") as f:
                for chunk in resp.iter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise ApiError(502, f"the API sent more than {max_bytes} bytes")
                    digest.update(chunk)
                    f.write(chunk)
        return digest.hexdigest(), etag if SHA256.match(etag) else None


def whole_id(kind: str, given: str, listing: Callable[[str], Iterator[dict[str, Any]]]) -> str:
    """The one id of `listing(prefix)` (the caller's own, listed by the API) that starts
    with `given`. A whole id is taken as it is: the route it goes to says if it is missing."""
    prefix = given.strip().lower()
    if WHOLE_ID.match(prefix):
        return prefix
    if not ID_PREFIX.match(prefix):
        raise IdNotFound(
            f"{given!r} is not a {kind} id: give the id or its first {MIN_ID_PREFIX} "
            "characters or more (hex digits)"
        )
    found = [str(item["id"]) for item in itertools.islice(listing(prefix), CANDIDATES_SHOWN + 1)]
    if not all(WHOLE_ID.match(i) and i.startswith(prefix) for i in found):
        # It becomes a file's name (`trainq download`): only an id may.
        raise IdNotFound(f"the API listed {found!r} for {given}: not {kind} ids")
    if not found:
        raise IdNotFound(f"no {kind} {given}")
    if len(found) > 1:
        shown = ", ".join(found[:CANDIDATES_SHOWN])
        more = " and more" if len(found) > CANDIDATES_SHOWN else ""
        raise IdNotFound(f"{kind} id {given} is ambiguous: {shown}{more}; give more of it")
    return found[0]


def _parse_sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    event: dict[str, Any] = {}
    for line in lines:
        if not line:
            if "data" in event:
                event["data"] = json.loads(event["data"])
                event.setdefault("event", "message")
                yield event
            event = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            event[field] = value.removeprefix(" ")

"""A small Python client for trainq's HTTP API (used by the `trainq` CLI): `Client` submits,
lists, follows (Server-Sent Events, resumed after a disconnect), cancels, deletes and
downloads jobs (sha256-checked), and reads sweeps and quotas; the data sets' calls are
client.datasets', the model registry's client.registry's, and ids given by their first
characters are found by client.ids. See docs/queue.md
("Through the HTTP API") and docs/api.md."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx

from client.datasets import DatasetCalls
from client.ids import CANDIDATES_SHOWN, IdNotFound, whole_id

__all__ = ["ApiError", "Client", "Downloaded", "IdNotFound", "whole_id"]
from client.registry import RegistryCalls
from client.sse import parse_sse
from core.spec import TERMINAL

# The most a download writes: a server that is not trainq's could send an endless body.
MAX_DOWNLOAD_BYTES = 2 << 30
SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Downloaded:
    """A model written to disk: its sha256, and whether the API sent one (its ETag) that
    the bytes were checked against."""

    sha256: str
    verified: bool


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


class Client(DatasetCalls, RegistryCalls):
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

    def submit(
        self,
        spec: dict[str, Any],
        idempotency_key: str | None = None,
        *,
        name: str | None = None,
        tags: Sequence[str] = (),
        notes: str | None = None,
    ) -> dict[str, Any]:
        """Submit a job of `spec`, named, tagged and annotated (no part of the spec: the
        same spec under the same key is the same job, whatever its labels)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = {**spec, **_labels(name, tags, notes)}
        return self._object(self.http.post("/jobs", json=body, headers=headers))

    def relabel(self, job_id: str, **changes: Any) -> dict[str, Any]:
        """PATCH the job's labels: `name=`, `notes=` (None removes it), `tags=` (all of
        them), `add_tags=`, `remove_tags=`; what is left out stays."""
        return self._object(self.http.patch(f"/jobs/{job_id}", json=changes))

    def relabel_sweep(self, sweep_id: str, **changes: Any) -> dict[str, Any]:
        """As `relabel`, for a sweep (its trials keep their own)."""
        return self._object(self.http.patch(f"/sweeps/{sweep_id}", json=changes))

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
        status: str | Sequence[str] | None = None,
        limit: int = 50,
        sweep_id: str | None = None,
        id_prefix: str | None = None,
        *,
        tags: Sequence[str] = (),
        name: str | None = None,
        dataset: str | None = None,
        model: str | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
        sort: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every job that the filters keep (any of `status`, every one of `tags`, names
        that start with `name`, ...), in `sort`'s order (default newest first: `-created`;
        `-test_accuracy` the best first), following the cursors. Times are ISO 8601."""
        given = {
            "status": [status] if isinstance(status, str) else list(status or ()),
            "tag": list(tags),
            "sweep_id": sweep_id,
            "id_prefix": id_prefix,
            "name": name,
            "dataset": dataset,
            "model": model,
            "created_after": created_after,
            "created_before": created_before,
            "sort": sort,
        }
        params = {k: v for k, v in given.items() if v not in (None, [])}
        return self._pages("/jobs", {**params, "limit": limit})

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
        return self._predict(f"/jobs/{job_id}/predict", images, {} if k is None else {"k": k})

    def _predict(
        self, path: str, images: list[str | Path | bytes], params: dict[str, Any]
    ) -> dict[str, Any]:
        files = [
            ("files", (f"image{i}", im if isinstance(im, bytes) else Path(im).read_bytes()))
            for i, im in enumerate(images)
        ]
        return self._object(self.http.post(path, files=files, params=params, timeout=120))

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
        self,
        sweep: dict[str, Any],
        idempotency_key: str | None = None,
        *,
        name: str | None = None,
        tags: Sequence[str] = (),
        notes: str | None = None,
    ) -> dict[str, Any]:
        """Start a sweep: {"base": JobSpec, "space": {...}, "objective", "sampler", "pruner",
        "trials", "parallel"}; its first trials are queued at once, each with the sweep's
        tags and named after it."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = {**sweep, **_labels(name, tags, notes)}
        return self._object(self.http.post("/sweeps", json=body, headers=headers))

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        return self._object(self.http.get(f"/sweeps/{sweep_id}"))

    def sweeps(self, limit: int = 20, id_prefix: str | None = None) -> Iterator[dict[str, Any]]:
        """Every sweep (whose id starts with `id_prefix`), newest first."""
        params: dict[str, Any] = {"limit": limit}
        if id_prefix:
            params["id_prefix"] = id_prefix
        return self._pages("/sweeps", params)

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
                    for event in parse_sse(resp.iter_lines()):
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
                    for event in parse_sse(resp.iter_lines()):
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
        params = {"format": format} if format else {}
        return self._download(f"/jobs/{job_id}/model", params, path, max_bytes)

    def _download(
        self, url: str, params: dict[str, str], path: Path, max_bytes: int | None
    ) -> Downloaded:
        max_bytes = MAX_DOWNLOAD_BYTES if max_bytes is None else max_bytes
        tmp = path.with_suffix(path.suffix + ".part")
        try:
            sha256, expected = self._stream_model(url, params, tmp, max_bytes)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if expected is not None and sha256 != expected:
            tmp.unlink(missing_ok=True)
            raise ApiError(502, f"downloaded model's sha256 {sha256} != {expected}")
        tmp.replace(path)
        return Downloaded(sha256, verified=expected is not None)

    def _stream_model(
        self, url: str, params: dict[str, str], tmp: Path, max_bytes: int
    ) -> tuple[str, str | None]:
        """The body written to `tmp`: its sha256, and the one the ETag gives (or None)."""
        digest, size = hashlib.sha256(), 0
        with self.http.stream("GET", url, params=params) as resp:
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


def _labels(name: str | None, tags: Sequence[str], notes: str | None) -> dict[str, Any]:
    """The labels given, to send beside a spec (those not given are left out of the body)."""
    given = {"name": name, "tags": list(tags) or None, "notes": notes}
    return {k: v for k, v in given.items() if v is not None}

"""The model registry's calls of the HTTP client (client.http.Client has them all):
register a job's model, list models, move aliases, download and predict by a version's
name. `ref` names a version: "name@alias" ("name@latest": the newest) or "name/N";
`owner`, the model's owner where it is another key's (shared with this one, or any as an
admin). See docs/registry.md."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import quote

import httpx

if TYPE_CHECKING:
    from client.http import Downloaded


class Calls(Protocol):
    """What these calls use of client.http.Client."""

    http: httpx.Client

    def _json(self, resp: httpx.Response) -> Any: ...
    def _object(self, resp: httpx.Response) -> dict[str, Any]: ...
    def _pages(self, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]: ...
    def _download(
        self, url: str, params: dict[str, str], path: Path, max_bytes: int | None
    ) -> Downloaded: ...
    def _predict(
        self, path: str, images: list[str | Path | bytes], params: dict[str, Any]
    ) -> dict[str, Any]: ...
    def _no_content(self, resp: httpx.Response) -> None: ...


class RegistryCalls:
    def register_model(
        self: Calls, job_id: str, name: str, owner: str | None = None
    ) -> dict[str, Any]:
        """The job's model as the next version of model `name` (made if new); the version
        it is already, if it is one."""
        return self._object(
            self.http.post(
                f"/models/{_part(name)}/versions", json={"job_id": job_id}, params=_owner(owner)
            )
        )

    def models(self: Calls, limit: int = 50) -> Iterator[dict[str, Any]]:
        """Every model the key may read, by name: its own, and those shared with it."""
        return self._pages("/models", {"limit": limit})

    def model(self: Calls, name: str, owner: str | None = None, limit: int = 20) -> dict[str, Any]:
        """The model, its aliases and its newest `limit` versions, with their lineage."""
        params: dict[str, Any] = {"limit": limit, **_owner(owner)}
        return self._object(self.http.get(f"/models/{_part(name)}", params=params))

    def model_version(self: Calls, ref: str, owner: str | None = None) -> dict[str, Any]:
        return self._object(self.http.get(model_path(ref), params=_owner(owner)))

    def move_alias(
        self: Calls,
        name: str,
        alias: str,
        version: int,
        expected_version: int | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Point `alias` at `version`; with `expected_version` (0: none yet), only if the
        alias points there now (else ApiError 409, nothing changed)."""
        body: dict[str, Any] = {"version": version}
        if expected_version is not None:
            body["expected_version"] = expected_version
        url = f"/models/{_part(name)}/aliases/{_part(alias)}"
        return self._object(self.http.put(url, json=body, params=_owner(owner)))

    def alias(self: Calls, name: str, alias: str, owner: str | None = None) -> dict[str, Any]:
        """Where the alias points, and its moves (who, when), newest first."""
        url = f"/models/{_part(name)}/aliases/{_part(alias)}"
        return self._object(self.http.get(url, params=_owner(owner)))

    def remove_alias(self: Calls, name: str, alias: str, owner: str | None = None) -> None:
        url = f"/models/{_part(name)}/aliases/{_part(alias)}"
        self._no_content(self.http.delete(url, params=_owner(owner)))

    def delete_model_version(
        self: Calls, name: str, version: int, owner: str | None = None
    ) -> None:
        url = f"/models/{_part(name)}/versions/{version}"
        self._no_content(self.http.delete(url, params=_owner(owner)))

    def share_model(self: Calls, name: str, reader: str, owner: str | None = None) -> list[Any]:
        """Admin: let the key whose owner id is `reader` read the model."""
        url = f"/models/{_part(name)}/shares/{_part(reader)}"
        return cast(list[Any], self._json(self.http.put(url, params=_owner(owner))))

    def download_model(
        self: Calls,
        ref: str,
        path: Path,
        format: str | None = None,
        owner: str | None = None,
        max_bytes: int | None = None,
    ) -> Downloaded:
        """download()'s twin for a version named by alias or number (`max_bytes`: by
        default, download()'s)."""
        params = {**({"format": format} if format else {}), **_owner(owner)}
        return self._download(f"{model_path(ref)}/model", params, path, max_bytes)

    def predict_model(
        self: Calls,
        ref: str,
        images: list[str | Path | bytes],
        k: int | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """predict()'s twin for a version named by alias or number; the answer names the
        version that answered."""
        params = {**({} if k is None else {"k": k}), **_owner(owner)}
        return self._predict(f"{model_path(ref)}/predict", images, params)

    def _no_content(self: Calls, resp: httpx.Response) -> None:
        if resp.status_code != 204:
            self._json(resp)


def model_path(ref: str) -> str:
    """The API path of a version named "name@alias" or "name/N" (also "name/versions/N");
    ValueError for anything else. Each part is URL-quoted: the API judges what it holds."""
    name, at, alias = ref.partition("@")
    if at:
        return f"/models/{_part(name)}@{_part(alias)}"
    name, slash, number = ref.partition("/")
    number = number.removeprefix("versions/")
    if not slash or not number.isdigit():
        raise ValueError(f"{ref!r} names no version: give NAME@ALIAS or NAME/VERSION")
    return f"/models/{_part(name)}/versions/{int(number)}"


def _part(text: str) -> str:
    return quote(text, safe="")


def _owner(owner: str | None) -> dict[str, str]:
    return {"owner": owner} if owner else {}

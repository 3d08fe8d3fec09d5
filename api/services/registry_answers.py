"""The model registry as the API shows it: a page of models, one model with its newest
versions, a version with its lineage and links, an alias with its moves. See
docs/registry.md."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from collections.abc import Sequence
from urllib.parse import urlencode

from sqlalchemy.orm import Session

from api.auth import Caller
from api.formats import DOWNLOAD_ORDER
from api.model_access import Ref, resolve, visible_model
from api.registry_schemas import (
    MAX_NUMBER,
    AliasDetail,
    AliasMoveOut,
    AliasOut,
    ModelDetail,
    ModelOut,
    ModelPage,
    VersionOut,
)
from core.db import Model, ModelAlias, ModelVersion
from core.errors import InvalidRequest, NotFound
from core.spec import ExportFormat
from core.store.registry import NAME_PATTERN
from core.store.registry_reads import (
    LATEST,
    alias_history,
    alias_rows,
    get_alias,
    list_models,
    version_count,
    versions_of,
)


def model_page(s: Session, caller: Caller, cursor: str | None, limit: int) -> ModelPage:
    """The models the caller may read, by name: its own and those shared with it (an
    admin's: every owner's)."""
    reader = None if caller.admin else caller.owner
    found = list_models(
        s, reader=reader, after=_decode(cursor) if cursor else None, limit=limit + 1
    )
    page = list(found[:limit])
    shared = {m.id for m in page if not caller.can_see(m.owner)}
    items = _model_outs(s, caller, page, shared)
    nxt = _encode(page[-1].name, page[-1].id) if len(found) > limit else None
    return ModelPage(items=items, next=nxt)


def model_detail(
    s: Session, caller: Caller, name: str, owner: str | None, before: int | None, limit: int
) -> ModelDetail:
    """The model, with its newest versions (older than `before`), at most `limit`."""
    seen = visible_model(s, caller, name, owner)
    [out] = _model_outs(s, caller, [seen.model], {seen.model.id} if seen.read_only else set())
    versions = versions_of(s, model_id=seen.model.id, before=before, limit=limit + 1)
    shown = list(versions[:limit])
    pointing: dict[int, list[str]] = {}
    for alias in out.aliases:
        pointing.setdefault(alias.version, []).append(alias.alias)
    outs = [version_out(s, caller, seen.model, v, pointing.get(v.version, [])) for v in shown]
    return ModelDetail(
        **out.model_dump(),
        versions=outs,
        next_before=shown[-1].version if len(versions) > limit else None,
    )


def version_detail(s: Session, caller: Caller, ref: Ref) -> VersionOut:
    seen, version = resolve(s, caller, ref)
    return version_out(s, caller, seen.model, version)


def alias_detail(
    s: Session, caller: Caller, name: str, owner: str | None, alias: str, limit: int
) -> AliasDetail:
    """Where the alias points, by whom it was moved and when, and its moves, newest first."""
    model = visible_model(s, caller, name, owner).model
    row = get_alias(s, model_id=model.id, alias=alias)
    if row is None:
        raise NotFound(f"model {name} has no alias {alias}")
    history = [
        AliasMoveOut(
            from_version=m.from_version,
            to_version=m.to_version,
            moved_by=m.moved_by,
            moved_at=utc_time(m.moved_at),
        )
        for m in alias_history(s, model_id=model.id, alias=alias, limit=limit)
    ]
    return AliasDetail(**_alias_out(row).model_dump(), history=history)


def version_out(
    s: Session,
    caller: Caller,
    model: Model,
    version: ModelVersion,
    aliases: list[str] | None = None,
) -> VersionOut:
    """The version as the API shows it; `aliases`, those pointing at it, read if not given."""
    if aliases is None:
        aliases = [
            a.name for a in alias_rows(s, model_ids=[model.id]) if a.version == version.version
        ]
    formats = [ExportFormat(f["format"]) for f in version.formats]
    base = f"/models/{model.name}/versions/{version.version}"
    owner = _owner_query(caller, model)
    return VersionOut.model_validate(
        {
            "model": model.name,
            "owner": model.owner,
            "version": version.version,
            "job_id": version.job_id,
            "aliases": aliases,
            "registered_by": version.registered_by,
            "registered_at": utc_time(version.registered_at),
            "default_format": next((f for f in DOWNLOAD_ORDER if f in formats), None),
            "lineage": {
                "job_id": version.job_id,
                "spec": version.spec,
                "dataset": version.dataset,
                "dataset_sha256": version.dataset_sha256,
                "metrics": version.metrics,
                "classes": version.classes,
                "formats": version.formats,
            },
            "links": {
                "self": _link(base, owner),
                "model": _link(f"{base}/model", owner),
                "models": {f: _link(f"{base}/model", owner, format=f) for f in formats},
                "predict": _link(f"{base}/predict", owner),
                "job": f"/jobs/{version.job_id}",
            },
        }
    )


def _model_outs(
    s: Session, caller: Caller, models: Sequence[Model], shared: set[int]
) -> list[ModelOut]:
    ids = [m.id for m in models]
    counts = version_count(s, model_ids=ids)
    aliases: dict[int, list[AliasOut]] = {}
    for row in alias_rows(s, model_ids=ids):
        aliases.setdefault(row.model_id, []).append(_alias_out(row))
    outs = []
    for m in models:
        count, newest = counts.get(m.id, (0, None))
        owner = _owner_query(caller, m)
        outs.append(
            ModelOut(
                name=m.name,
                owner=m.owner,
                read_only=m.id in shared,
                created_by=m.created_by,
                created_at=utc_time(m.created_at),
                version_count=count,
                latest_version=newest,
                aliases=aliases.get(m.id, []),
                links={
                    "self": _link(f"/models/{m.name}", owner),
                    "latest": _link(f"/models/{m.name}@{LATEST}", owner),
                },
            )
        )
    return outs


def _alias_out(row: ModelAlias) -> AliasOut:
    return AliasOut(
        alias=row.name, version=row.version, moved_by=row.moved_by, moved_at=utc_time(row.moved_at)
    )


def _owner_query(caller: Caller, model: Model) -> str | None:
    """The `owner` a link to the model needs: none for the caller's own."""
    return None if model.owner == caller.owner else model.owner


def _link(path: str, owner: str | None, **params: str) -> str:
    query = {**params, **({"owner": owner} if owner else {})}
    return f"{path}?{urlencode(query)}" if query else path


def utc_time(t: dt.datetime) -> dt.datetime:
    """A time the database stored (SQLite hands them back naive), in UTC."""
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


def _encode(name: str, model_id: int) -> str:
    return base64.urlsafe_b64encode(f"{name}|{model_id}".encode()).decode()


def _decode(cursor: str) -> tuple[str, int]:
    """(name, id) of a page's last model; a 422 on `cursor` for anything _encode did not make."""
    try:
        name, _, number = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        model_id = int(number)
        if not re.fullmatch(NAME_PATTERN, name) or not 0 < model_id <= MAX_NUMBER:
            raise ValueError(cursor)
        return name, model_id
    except (ValueError, binascii.Error, UnicodeDecodeError) as e:
        problem = {
            "loc": ["query", "cursor"],
            "msg": "not a cursor from a previous page",
            "type": "value_error",
        }
        raise InvalidRequest([problem]) from e

"""Reads of the model registry (core.store.registry): models as a reader may list them,
versions, aliases and their moves, shares, and where a job is registered. See
docs/registry.md."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from core.db import AliasMove, Model, ModelAlias, ModelShare, ModelVersion

# Not an alias anyone sets: `name@latest` is always the newest version.
LATEST = "latest"


@dataclass(frozen=True)
class Registration:
    """Where a job is registered: a version of a model."""

    owner: str
    name: str
    version: int


def get_model(s: Session, *, owner: str, name: str) -> Model | None:
    return s.scalars(select(Model).where(Model.owner == owner, Model.name == name)).first()


def is_shared_with(s: Session, *, model_id: int, reader: str) -> bool:
    return s.get(ModelShare, (model_id, reader)) is not None


def shares_of(s: Session, *, model_id: int) -> Sequence[ModelShare]:
    return s.scalars(
        select(ModelShare).where(ModelShare.model_id == model_id).order_by(ModelShare.reader)
    ).all()


def list_models(
    s: Session, *, reader: str | None, after: tuple[str, int] | None, limit: int
) -> Sequence[Model]:
    """By name (then id): `reader`'s own and those shared with it; every owner's for None
    (an admin). `after`: the (name, id) of the previous page's last."""
    q = select(Model)
    if reader is not None:
        shared = select(ModelShare.model_id).where(ModelShare.reader == reader)
        q = q.where(or_(Model.owner == reader, Model.id.in_(shared)))
    if after is not None:
        name, model_id = after
        q = q.where(or_(Model.name > name, (Model.name == name) & (Model.id > model_id)))
    return s.scalars(q.order_by(Model.name, Model.id).limit(limit)).all()


def get_version(s: Session, *, model_id: int, version: int) -> ModelVersion | None:
    return s.get(ModelVersion, (model_id, version))


def versions_of(
    s: Session, *, model_id: int, before: int | None = None, limit: int = 100
) -> Sequence[ModelVersion]:
    """Newest first; `before`: only those older than this version."""
    q = select(ModelVersion).where(ModelVersion.model_id == model_id)
    if before is not None:
        q = q.where(ModelVersion.version < before)
    return s.scalars(q.order_by(ModelVersion.version.desc()).limit(limit)).all()


def version_count(s: Session, *, model_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Per model, its number of versions and its newest version's number."""
    rows = s.execute(
        select(ModelVersion.model_id, func.count(), func.max(ModelVersion.version))
        .where(ModelVersion.model_id.in_(model_ids))
        .group_by(ModelVersion.model_id)
    ).all()
    return {model_id: (count, newest) for model_id, count, newest in rows}


def aliases_of(s: Session, *, model_id: int) -> list[tuple[str, int]]:
    """(alias, version), by alias."""
    rows = s.execute(
        select(ModelAlias.name, ModelAlias.version)
        .where(ModelAlias.model_id == model_id)
        .order_by(ModelAlias.name)
    )
    return [(name, version) for name, version in rows]


def alias_rows(s: Session, *, model_ids: Sequence[int]) -> Sequence[ModelAlias]:
    return s.scalars(
        select(ModelAlias)
        .where(ModelAlias.model_id.in_(model_ids))
        .order_by(ModelAlias.model_id, ModelAlias.name)
    ).all()


def get_alias(s: Session, *, model_id: int, alias: str) -> ModelAlias | None:
    return s.get(ModelAlias, (model_id, alias))


def version_for_alias(s: Session, *, model_id: int, alias: str) -> ModelVersion | None:
    """The version `alias` points at (LATEST: the newest), or None."""
    if alias == LATEST:
        return s.scalars(
            select(ModelVersion)
            .where(ModelVersion.model_id == model_id)
            .order_by(ModelVersion.version.desc())
            .limit(1)
        ).first()
    row = s.get(ModelAlias, (model_id, alias))
    return None if row is None else s.get(ModelVersion, (model_id, row.version))


def alias_history(s: Session, *, model_id: int, alias: str, limit: int = 50) -> Sequence[AliasMove]:
    """The alias's moves, newest first."""
    return s.scalars(
        select(AliasMove)
        .where(AliasMove.model_id == model_id, AliasMove.alias == alias)
        .order_by(AliasMove.id.desc())
        .limit(limit)
    ).all()


def registrations_of(s: Session, *, job_id: str) -> list[Registration]:
    """Every version the job's model is, by model."""
    rows = s.execute(
        select(Model.owner, Model.name, ModelVersion.version)
        .join(Model, Model.id == ModelVersion.model_id)
        .where(ModelVersion.job_id == job_id)
        .order_by(Model.name, ModelVersion.version)
    ).all()
    return [Registration(owner, name, version) for owner, name, version in rows]

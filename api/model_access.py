"""What a caller may see of the model registry: its own models, those an admin shared with
it read-only, any for an admin; another owner's model is answered exactly like a missing
one, also through an alias or a version (as api.access does for jobs). See
docs/registry.md."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from api.auth import Caller
from core.db import Job, Model, ModelVersion
from core.errors import NotFound, ReadOnlyModel
from core.store.registry_reads import (
    LATEST,
    get_model,
    get_version,
    is_shared_with,
    version_for_alias,
)


@dataclass(frozen=True)
class Ref:
    """A version as a request names it: by number, or by alias (`latest`: the newest)."""

    name: str
    owner: str | None  # the model's owner, where the caller names another's
    version: int | None = None
    alias: str | None = None

    def __str__(self) -> str:
        return f"{self.name}@{self.alias}" if self.alias else f"{self.name}/versions/{self.version}"


@dataclass(frozen=True)
class Seen:
    """A model the caller may read; `read_only`: shared with it, not its own."""

    model: Model
    read_only: bool


def visible_model(s: Session, caller: Caller, name: str, owner: str | None) -> Seen:
    """The model `name` of `owner` (default: the caller), if the caller may read it; 404
    otherwise, the same whether it is missing or another's that was not shared with it."""
    model = get_model(s, owner=owner or caller.owner, name=name)
    missing = NotFound(f"no model {name}" + (f" of owner {owner}" if owner else ""))
    if model is None:
        raise missing
    if caller.can_see(model.owner):
        return Seen(model, read_only=False)
    if is_shared_with(s, model_id=model.id, reader=caller.owner):
        return Seen(model, read_only=True)
    raise missing


def writable_model(s: Session, caller: Caller, name: str, owner: str | None) -> Model:
    """The model, if the caller may change it (its own, or any for an admin); 403 for one
    shared with it read-only, 404 as visible_model."""
    seen = visible_model(s, caller, name, owner)
    if seen.read_only:
        raise ReadOnlyModel(
            f"model {name} of {seen.model.owner} is shared with this key read-only: it may "
            "download and predict with it, never register, move an alias or delete"
        )
    return seen.model


def resolve(s: Session, caller: Caller, ref: Ref) -> tuple[Seen, ModelVersion]:
    """The model and the version `ref` names; 404 for an alias or a version it has not."""
    seen = visible_model(s, caller, ref.name, ref.owner)
    if ref.alias is not None:
        version = version_for_alias(s, model_id=seen.model.id, alias=ref.alias)
        if version is None:
            why = "no version yet" if ref.alias == LATEST else f"no alias {ref.alias}"
            raise NotFound(f"model {ref.name} has {why}")
    else:
        assert ref.version is not None
        version = get_version(s, model_id=seen.model.id, version=ref.version)
        if version is None:
            raise NotFound(f"model {ref.name} has no version {ref.version}")
    return seen, version


def job_of(s: Session, version: ModelVersion) -> Job:
    job = s.get(Job, version.job_id)
    if job is None:  # the key to it refuses its deletion: only a hand-edited database
        raise NotFound(f"version {version.version}'s job {version.job_id} is gone")
    return job

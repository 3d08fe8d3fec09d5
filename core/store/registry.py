"""The model registry: named models of an owner, their numbered versions (each one succeeded
job's model, with its lineage), aliases that point at one version each and every move of
them, and read-only shares. Every change to one model runs under its row's lock, so that
two at once apply one after the other. See docs/registry.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, SQLColumnExpression, delete, exists, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.db import (
    AliasMove,
    Artifact,
    Job,
    Model,
    ModelAlias,
    ModelShare,
    ModelVersion,
    as_utc,
    utcnow,
)
from core.errors import (
    AliasChanged,
    InvalidRequest,
    ModelPurged,
    NoModel,
    NotFound,
    VersionInUse,
)
from core.spec import ExportFormat, JobStatus
from core.store.deletion import hold_job_id
from core.store.registry_reads import aliases_of
from core.webhooks.outbox import EventType, record_event

# A model's name and an alias: lower-case slugs that never hold "@" or "/", so that
# /models/{name}@{alias} reads one way only. An alias starts with a letter: `digits@3`
# would read as version 3.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
ALIAS_PATTERN = r"^[a-z][a-z0-9_.-]{0,63}$"
# `expected_version` that says "the alias must not exist yet".
NOWHERE = 0


@dataclass(frozen=True)
class Registered:
    """A job's model as a version of a model: made now, or found registered before."""

    version: ModelVersion
    created: bool


@dataclass(frozen=True)
class AliasMoved:
    """One move of an alias as it applied (`moved` False: it pointed there already)."""

    model_id: int
    alias: str
    from_version: int | None
    to_version: int | None
    moved_by: str
    moved_at: Any
    moved: bool


def lock_model(s: Session, *, model_id: int) -> Model:
    """The model's row, held until the commit: registrations, alias moves and deletions of
    one model run one after the other, each reading what the one before committed (on
    SQLite the transaction holds the one write lock already). NotFound if it is gone."""
    model = s.scalars(
        select(Model)
        .where(Model.id == model_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).first()
    if model is None:
        raise NotFound("the model was deleted meanwhile")
    return model


def _model_for_update(s: Session, *, owner: str, name: str, created_by: str) -> Model:
    """The owner's model `name`, made if it is not there (two requests making it at once
    both get the one row), locked (lock_model)."""
    values = {
        "owner": owner,
        "name": name,
        "last_version": 0,
        "created_by": created_by,
        "created_at": utcnow(),
    }
    dialect = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
    s.execute(dialect.insert(Model).values(**values).on_conflict_do_nothing())
    model_id = s.scalar(select(Model.id).where(Model.owner == owner, Model.name == name))
    assert model_id is not None  # inserted above, or there before
    return lock_model(s, model_id=model_id)


def register_job(
    s: Session, *, owner: str, name: str, job_id: str, registered_by: str
) -> Registered:
    """The succeeded job's model as the next version of `owner`'s model `name` (made if
    new), with its lineage; the version it is already, if it is one. The job's id is held
    first (core.store.deletion.hold_job_id), as its deletion and its purge hold it, so that
    none of them acts on what the other is changing. NoModel (409) for a job that has not
    succeeded or stored no model, ModelPurged (410) for one whose model is gone, NotFound
    for one deleted meanwhile."""
    hold_job_id(s, job_id=job_id)
    job = s.scalars(
        select(Job).where(Job.id == job_id).execution_options(populate_existing=True)
    ).first()
    if job is None:
        raise NotFound(f"no job {job_id}")
    formats = _model_formats(s, job)
    model = _model_for_update(s, owner=owner, name=name, created_by=registered_by)
    found = s.scalars(
        select(ModelVersion).where(ModelVersion.model_id == model.id, ModelVersion.job_id == job_id)
    ).first()
    if found is not None:
        return Registered(found, created=False)
    model.last_version += 1
    version = ModelVersion(
        model_id=model.id,
        version=model.last_version,
        job_id=job.id,
        registered_by=registered_by,
        registered_at=utcnow(),
        formats=formats,
        **lineage(job),
    )
    s.add(version)
    s.flush()
    return Registered(version, created=True)


def _model_formats(s: Session, job: Job) -> list[dict[str, Any]]:
    """The formats of the job's model that it stored, each with its sha256 and size; the
    refusal that says why there is none to register."""
    if job.status != JobStatus.succeeded:
        raise NoModel(
            f"job {job.id} is {job.status}: only a succeeded job's model can be registered"
        )
    if job.purged_at is not None:
        raise ModelPurged(
            f"job {job.id}'s model was removed on {as_utc(job.purged_at)} by the retention "
            "policy: it cannot be registered; train it again"
        )
    rows = s.execute(
        select(Artifact.format, Artifact.sha256, Artifact.size).where(
            Artifact.job_id == job.id, Artifact.format.in_([f.value for f in ExportFormat])
        )
    ).all()
    if not rows:
        raise NoModel(f"job {job.id} stored no model (every export failed its check)")
    order = list(ExportFormat)
    return [
        {"format": fmt, "sha256": sha, "size": size}
        for fmt, sha, size in sorted(rows, key=lambda r: order.index(ExportFormat(r[0])))
    ]


def lineage(job: Job) -> dict[str, Any]:
    """What a version keeps of its job, so that it says where it came from: the spec, the
    data set and its sha256, the final metrics and the class names."""
    dataset = (job.record or {}).get("dataset") or {}
    classes = dataset.get("classes")
    return {
        "spec": job.spec,
        "dataset": str(job.spec.get("dataset", dataset.get("name", ""))),
        "dataset_sha256": dataset.get("sha256"),
        "metrics": job.result,
        "classes": classes if isinstance(classes, list) else None,
    }


def move_alias(
    s: Session,
    *,
    model_id: int,
    alias: str,
    to_version: int | None,
    moved_by: str,
    expected: int | None = None,
) -> AliasMoved:
    """Point `alias` at `to_version` (None: remove it), and write the move in its history,
    in the caller's transaction: the one place an alias moves. Under the model's lock, so
    that two moves at once apply in turn, the second seeing the first. `expected`: the
    version the caller believes the alias points at (NOWHERE: none yet); AliasChanged (409)
    if it points elsewhere now. None moves it whatever it points at."""
    model = lock_model(s, model_id=model_id)
    current = s.get(ModelAlias, (model_id, alias), populate_existing=True)
    now_at = current.version if current is not None else None
    if expected is not None and (now_at or NOWHERE) != expected:
        where = f"version {now_at}" if now_at is not None else "no version (it does not exist)"
        raise AliasChanged(
            f"alias {alias} points at {where}, not {expected} as expected: it was moved "
            "meanwhile; read it again (GET the model) and decide"
        )
    if to_version is None and current is None:
        raise NotFound(f"no alias {alias}")
    if to_version is not None and s.get(ModelVersion, (model_id, to_version)) is None:
        raise InvalidRequest([_no_version(to_version)])
    at = utcnow()
    if now_at == to_version:
        return AliasMoved(model_id, alias, now_at, to_version, moved_by, at, moved=False)
    if current is None:
        s.add(ModelAlias(model_id=model_id, name=alias, version=to_version, moved_by=moved_by,
                         moved_at=at))  # fmt: skip
    elif to_version is None:
        s.delete(current)
    else:
        current.version, current.moved_by, current.moved_at = to_version, moved_by, at
    s.add(AliasMove(model_id=model_id, alias=alias, from_version=now_at, to_version=to_version,
                    moved_by=moved_by, moved_at=at))  # fmt: skip
    model.alias_sequence += 1  # under the row's lock: the model's moves numbered in turn
    s.flush()
    moved = AliasMoved(model_id, alias, now_at, to_version, moved_by, at, moved=True)
    _tell_webhooks(s, moved, model)
    return moved


def _no_version(version: int) -> dict[str, Any]:
    return {
        "loc": ["body", "version"],
        "msg": f"the model has no version {version}: list its versions (GET /models/{{name}})",
        "type": "unknown_version",
        "input": version,
    }


def delete_version(s: Session, *, model_id: int, version: int) -> None:
    """Delete the version (its job may then be deleted or purged); VersionInUse while an
    alias points at it, NotFound if there is no such version."""
    lock_model(s, model_id=model_id)
    row = s.get(ModelVersion, (model_id, version), populate_existing=True)
    if row is None:
        raise NotFound(f"no version {version}")
    pointing = sorted(alias for alias, v in aliases_of(s, model_id=model_id) if v == version)
    if pointing:
        raise VersionInUse(
            f"version {version} is where alias {', '.join(pointing)} points: move or remove "
            "the alias first"
        )
    s.delete(row)
    s.flush()


def delete_model(s: Session, *, model_id: int) -> None:
    """Delete the model with its versions, aliases' history and shares; VersionInUse while
    an alias points anywhere (a service may be following it)."""
    lock_model(s, model_id=model_id)
    aliases = sorted(alias for alias, _ in aliases_of(s, model_id=model_id))
    if aliases:
        raise VersionInUse(
            f"the model's aliases {', '.join(aliases)} point at versions a service may be "
            "following: remove them first (DELETE /models/{name}/aliases/{alias})"
        )
    for table in (ModelShare, AliasMove, ModelVersion):
        s.execute(delete(table).where(table.model_id == model_id))
    s.execute(delete(Model).where(Model.id == model_id))


def share_model(s: Session, *, model_id: int, reader: str, shared_by: str) -> bool:
    """Let `reader` download and predict with the model; False if it could already."""
    lock_model(s, model_id=model_id)
    if s.get(ModelShare, (model_id, reader)) is not None:
        return False
    s.add(ModelShare(model_id=model_id, reader=reader, shared_by=shared_by, shared_at=utcnow()))
    s.flush()
    return True


def unshare_model(s: Session, *, model_id: int, reader: str) -> bool:
    """False if the model was not shared with `reader`."""
    gone = s.execute(
        delete(ModelShare).where(ModelShare.model_id == model_id, ModelShare.reader == reader)
    )
    return bool(gone.rowcount)  # type: ignore[attr-defined]


def registered(job_id: SQLColumnExpression[str]) -> ColumnElement[bool]:
    """Whether the job `job_id` names is a version of some model (ix_model_versions_job):
    what the retention policy and deletion leave alone."""
    return exists(select(ModelVersion.job_id).where(ModelVersion.job_id == job_id))


def _tell_webhooks(s: Session, moved: AliasMoved, model: Model) -> None:
    """The move's model.alias_moved event, in the move's own transaction
    (core.webhooks.outbox), numbered by the model's `alias_sequence`: two moves at once
    (one waits for the other's lock) carry numbers in the order they applied."""
    data = {
        "sequence": model.alias_sequence,
        "model": model.name,
        "alias": moved.alias,
        "from_version": moved.from_version,
        "to_version": moved.to_version,
        "moved_by": moved.moved_by,
        "moved_at": moved.moved_at.isoformat(),
    }
    record_event(s, owner=model.owner, type=EventType.model_alias_moved, data=data)

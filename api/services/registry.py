"""What the /models routes change, and how they serve: registrations, alias moves, deletions
and shares, each in one transaction of the store (core.store.registry), and a version's
download and prediction, which are its job's own (api.services.models,
api.services.predict). Who may see what: api.model_access. See docs/registry.md."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from sqlalchemy.orm import Session

from api.access import visible_job
from api.auth import Caller
from api.model_access import Ref, job_of, resolve, visible_model, writable_model
from api.registry_schemas import AliasIn, AliasMovedOut, ShareOut, VersionOut
from api.services.models import StoredModel, stored_model
from api.services.predict import Target, job_target
from api.services.registry_answers import utc_time, version_out
from core.db import Database, Job, Model
from core.errors import InvalidRequest, JobRegistered, NotFound
from core.spec import ExportFormat
from core.store.registry import (
    delete_model,
    delete_version,
    move_alias,
    register_job,
    share_model,
    unshare_model,
)
from core.store.registry_reads import LATEST, registrations_of, shares_of


@dataclass(frozen=True)
class VersionTarget:
    """What a prediction by version or alias runs: the version's job's model."""

    target: Target
    name: str
    version: int


def version_download(
    s: Session, caller: Caller, ref: Ref, format: ExportFormat | None
) -> StoredModel:
    """The version's job's model file (api.services.models), named after the model."""
    seen, version = resolve(s, caller, ref)
    model = stored_model(s, job_of(s, version), format)
    name = f"{seen.model.name}-v{version.version}{model.format.suffix}"
    headers = {
        **model.headers,
        "Content-Disposition": f'attachment; filename="{name}"',
        "X-Model-Version": str(version.version),
    }
    return dataclasses.replace(model, headers=headers)


def version_target(s: Session, caller: Caller, ref: Ref) -> VersionTarget:
    """The version's job's model to predict with (api.services.predict)."""
    seen, version = resolve(s, caller, ref)
    return VersionTarget(job_target(s, job_of(s, version)), seen.model.name, version.version)


def register(
    db: Database, caller: Caller, name: str, owner: str | None, job_id: uuid.UUID
) -> tuple[VersionOut, bool]:
    """The caller's job as the next version of the model (made if new); the version it is
    already, with False, if it is one. Another owner's job is a 404, as everywhere."""
    with db.reader() as s:
        visible_job(s, caller, job_id)
        model_owner = owner or caller.owner
        if model_owner != caller.owner and not caller.admin:
            writable_model(s, caller, name, owner)  # never the caller's: 404, or 403 if shared
    with db.writer() as s:
        done = register_job(
            s, owner=model_owner, name=name, job_id=str(job_id), registered_by=caller.owner
        )
        model = s.get(Model, done.version.model_id)
        assert model is not None  # locked by the registration
        return version_out(s, caller, model, done.version), done.created


def move(
    db: Database, caller: Caller, name: str, owner: str | None, alias: str, body: AliasIn
) -> AliasMovedOut:
    """Point the alias at the body's version (core.store.registry.move_alias)."""
    if alias == LATEST:
        raise InvalidRequest(
            [
                {
                    "loc": ["path", "alias"],
                    "msg": f"{LATEST!r} always names the newest version: choose another alias",
                    "type": "reserved_alias",
                    "input": alias,
                }
            ]
        )
    with db.writer() as s:
        model = writable_model(s, caller, name, owner)
        moved = move_alias(
            s,
            model_id=model.id,
            alias=alias,
            to_version=body.version,
            moved_by=caller.owner,
            expected=body.expected_version,
        )
    return AliasMovedOut(
        alias=alias,
        version=moved.to_version,
        previous_version=moved.from_version,
        moved=moved.moved,
        moved_by=moved.moved_by,
        moved_at=moved.moved_at,
    )


def remove_alias(db: Database, caller: Caller, name: str, owner: str | None, alias: str) -> None:
    with db.writer() as s:
        model = writable_model(s, caller, name, owner)
        move_alias(s, model_id=model.id, alias=alias, to_version=None, moved_by=caller.owner)


def remove_version(
    db: Database, caller: Caller, name: str, owner: str | None, version: int
) -> None:
    with db.writer() as s:
        model = writable_model(s, caller, name, owner)
        delete_version(s, model_id=model.id, version=version)


def remove_model(db: Database, caller: Caller, name: str, owner: str | None) -> None:
    with db.writer() as s:
        delete_model(s, model_id=writable_model(s, caller, name, owner).id)


def share(db: Database, admin: Caller, name: str, owner: str | None, reader: str) -> bool:
    """An admin lets `reader` read the model; False if it could already."""
    with db.writer() as s:
        model = visible_model(s, admin, name, owner).model
        return share_model(s, model_id=model.id, reader=reader, shared_by=admin.owner)


def unshare(db: Database, admin: Caller, name: str, owner: str | None, reader: str) -> None:
    with db.writer() as s:
        model = visible_model(s, admin, name, owner).model
        if not unshare_model(s, model_id=model.id, reader=reader):
            raise NotFound(f"model {name} is not shared with {reader}")


def shares(s: Session, caller: Caller, name: str, owner: str | None) -> list[ShareOut]:
    """Who else may read the model: its owner and admins may ask."""
    model = writable_model(s, caller, name, owner)
    return [
        ShareOut(reader=sh.reader, shared_by=sh.shared_by, shared_at=utc_time(sh.shared_at))
        for sh in shares_of(s, model_id=model.id)
    ]


def not_while_registered(s: Session, job: Job) -> None:
    """JobRegistered (409) if the job's model is a registered model's version: the version
    must outlive it. The message names the versions of models of the job's own owner (whom
    the caller either is, or sees all as an admin); others' only by their count."""
    found = registrations_of(s, job_id=job.id)
    if not found:
        return
    own = [f"version {r.version} of model {r.name}" for r in found if r.owner == job.owner]
    others = len(found) - len(own)
    named = own + ([f"{others} version(s) of another key's models"] if others else [])
    first = next((r for r in found if r.owner == job.owner), None)
    how = (
        f"DELETE /models/{first.name}/versions/{first.version}"
        if first is not None
        else "DELETE /models/{name}/versions/{n}"
    )
    raise JobRegistered(
        f"job {job.id} is {', '.join(named)}: a registered version keeps its job's model; "
        f"delete the version first ({how}, once no alias points at it)"
    )

"""/models: the model registry. Named models with numbered versions (each one succeeded
job's model), aliases that move atomically, downloads and predictions by alias or
version, read-only shares. The work is in api.services.registry. See docs/registry.md."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Response

from api.deps import (
    AdminDep,
    CallerDep,
    DatabaseDep,
    ReaderDep,
)
from api.registry_schemas import (
    MAX_NUMBER,
    AliasDetail,
    AliasIn,
    AliasMovedOut,
    ModelDetail,
    ModelPage,
    RegisterIn,
    ShareOut,
    VersionOut,
)
from api.responses import NO_KEY, NOT_ADMIN, Responses, problem
from api.services import registry
from api.services import registry_answers as answers
from api.services.registry import Ref
from core.spec import ExportFormat
from core.store.registry import ALIAS_PATTERN, NAME_PATTERN
from core.text import PLAIN_PATTERN

router = APIRouter(prefix="/models", tags=["models"])

ModelName = Annotated[
    str,
    Path(
        max_length=64,
        pattern=NAME_PATTERN,
        description="The model's name: 1 to 64 lower-case letters, digits, '.', '_' and '-', "
        "starting with a letter or digit.",
    ),
]
AliasName = Annotated[
    str,
    Path(
        max_length=64,
        pattern=ALIAS_PATTERN,
        description="An alias (production, staging, ...): 1 to 64 lower-case letters, digits, "
        "'.', '_' and '-', starting with a letter. `latest` is the newest version.",
    ),
]
VersionNumber = Annotated[int, Path(ge=1, le=MAX_NUMBER, description="A version's number.")]
Owner = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=64,
        pattern=PLAIN_PATTERN,
        description="The model's owner id (k_..., GET /usage names yours): for another key's "
        "model that an admin shared with yours, or any model as an admin. Default: your own.",
    ),
]
Reader = Annotated[
    str,
    Path(min_length=1, max_length=64, pattern=PLAIN_PATTERN, description="An owner id, k_..."),
]
Format = Annotated[
    ExportFormat | None,
    Query(description="torchscript, pt2 or onnx; default the version's `default_format`."),
]
IfNoneMatch = Annotated[str | None, Header(max_length=200, pattern=PLAIN_PATTERN)]

NO_MODEL: Responses = {
    404: problem(
        "No such model, version or alias: another key's model reads the same, unless an "
        "admin shared it with yours."
    )
}
READ_ONLY: Responses = {403: problem("The model is shared with this key read-only.")}
ERRORS: Responses = {**NO_KEY, **NO_MODEL}
WRITE_ERRORS: Responses = {**ERRORS, **READ_ONLY}


@router.get("", response_model=ModelPage, responses=NO_KEY, summary="List models, by name")
def get_models(
    session: ReaderDep,
    caller: CallerDep,
    cursor: Annotated[str | None, Query(max_length=200, pattern=PLAIN_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> ModelPage:
    """The key's own models and those an admin shared with it (`read_only`); an admin
    key's: every owner's."""
    return answers.model_page(session, caller, cursor, limit)


@router.post(
    "/{name}/versions",
    status_code=201,
    response_model=VersionOut,
    responses={
        **WRITE_ERRORS,
        200: {"model": VersionOut, "description": "The job is a version of it already."},
        404: problem("No such job (or not yours), or another key's model."),
        409: problem("The job has not succeeded, or stored no model."),
        410: problem("The retention policy removed the job's model (`purged_at`)."),
        422: {"description": "A bad name or body; `detail[].loc` names the field."},
    },
    summary="Register a job's model as the model's next version",
    description="Makes the model on its first version. The version keeps the job's model "
    "and its lineage (spec, data set and its sha256, final metrics, class names, formats): "
    "while it exists the job cannot be deleted (409) and the retention policy and "
    "`trainq gc` leave it whole.",
)
def register(
    name: ModelName,
    body: RegisterIn,
    response: Response,
    db: DatabaseDep,
    caller: CallerDep,
    owner: Owner = None,
) -> VersionOut:
    out, created = registry.register(db, caller, name, owner, body.job_id)
    if not created:
        response.status_code = 200
    response.headers["Location"] = out.links.self
    return out


# The alias routes come before /{name}: its parameter would take "digits@production" too.


@router.get(
    "/{name}@{alias}",
    response_model=VersionOut,
    responses=ERRORS,
    summary="The version an alias points at",
    description="`@latest` is the newest version. `@` may be sent as it is or as `%40`.",
)
def get_by_alias(
    name: ModelName, alias: AliasName, session: ReaderDep, caller: CallerDep, owner: Owner = None
) -> VersionOut:
    return answers.version_detail(session, caller, Ref(name, owner, alias=alias))


@router.get(
    "/{name}",
    response_model=ModelDetail,
    responses=ERRORS,
    summary="One model: its aliases and newest versions",
)
def get_model(
    name: ModelName,
    session: ReaderDep,
    caller: CallerDep,
    owner: Owner = None,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_NUMBER, description="Only versions older than this.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> ModelDetail:
    return answers.model_detail(session, caller, name, owner, before, limit)


@router.delete(
    "/{name}",
    status_code=204,
    responses={**WRITE_ERRORS, 409: problem("An alias still points at one of its versions.")},
    summary="Delete a model and its versions",
    description="Refused while any alias exists (a service may follow it): remove the "
    "aliases first. Its jobs stay, and may then be deleted or purged.",
)
def delete_model(
    name: ModelName, db: DatabaseDep, caller: CallerDep, owner: Owner = None
) -> Response:
    registry.remove_model(db, caller, name, owner)
    return Response(status_code=204)


@router.get(
    "/{name}/versions/{version}",
    response_model=VersionOut,
    responses=ERRORS,
    summary="One version, with its lineage",
)
def get_version(
    name: ModelName,
    version: VersionNumber,
    session: ReaderDep,
    caller: CallerDep,
    owner: Owner = None,
) -> VersionOut:
    return answers.version_detail(session, caller, Ref(name, owner, version=version))


@router.delete(
    "/{name}/versions/{version}",
    status_code=204,
    responses={**WRITE_ERRORS, 409: problem("An alias points at it.")},
    summary="Delete a version",
    description="Its job is no longer kept for it: it may then be deleted, and purged by "
    "the retention policy. Refused while an alias points at it. Its number is never given "
    "again.",
)
def delete_version(
    name: ModelName, version: VersionNumber, db: DatabaseDep, caller: CallerDep, owner: Owner = None
) -> Response:
    registry.remove_version(db, caller, name, owner, version)
    return Response(status_code=204)


@router.get(
    "/{name}/aliases/{alias}",
    response_model=AliasDetail,
    responses=ERRORS,
    summary="An alias: where it points, and its moves (who, when), newest first",
)
def get_alias(
    name: ModelName,
    alias: AliasName,
    session: ReaderDep,
    caller: CallerDep,
    owner: Owner = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> AliasDetail:
    return answers.alias_detail(session, caller, name, owner, alias, limit)


@router.put(
    "/{name}/aliases/{alias}",
    response_model=AliasMovedOut,
    responses={
        **WRITE_ERRORS,
        409: problem("`expected_version` given, and the alias points elsewhere now."),
        422: {"description": "No such version (`loc`: body.version), or alias `latest`."},
    },
    summary="Point an alias at a version (made if new)",
    description="Atomic: whoever downloads or predicts by the alias gets the old version or "
    "the new one, never neither. Two moves at once apply one after the other; one that "
    "sent `expected_version` is refused (409, nothing changed) if the other moved the "
    "alias first. Each move is kept in the alias's history, with who moved it and when.",
)
def put_alias(
    name: ModelName,
    alias: AliasName,
    body: AliasIn,
    db: DatabaseDep,
    caller: CallerDep,
    owner: Owner = None,
) -> AliasMovedOut:
    return registry.move(db, caller, name, owner, alias, body)


@router.delete(
    "/{name}/aliases/{alias}",
    status_code=204,
    responses=WRITE_ERRORS,
    summary="Remove an alias",
    description="Kept in its history as a move to null.",
)
def delete_alias(
    name: ModelName, alias: AliasName, db: DatabaseDep, caller: CallerDep, owner: Owner = None
) -> Response:
    registry.remove_alias(db, caller, name, owner, alias)
    return Response(status_code=204)


@router.get(
    "/{name}/shares",
    response_model=list[ShareOut],
    responses=WRITE_ERRORS,
    summary="The keys the model is shared with (its owner and admins may ask)",
)
def get_shares(
    name: ModelName, session: ReaderDep, caller: CallerDep, owner: Owner = None
) -> list[ShareOut]:
    return registry.shares(session, caller, name, owner)


@router.put(
    "/{name}/shares/{reader}",
    response_model=list[ShareOut],
    responses={**ERRORS, **NOT_ADMIN},
    summary="Share a model read-only with another key (admins)",
    description="The reader (an owner id, k_...) may then list, download and predict with "
    "the model (with `?owner=` naming the model's owner), never register, move an alias or "
    "delete. Answers every share of the model.",
)
def put_share(
    name: ModelName,
    reader: Reader,
    db: DatabaseDep,
    session: ReaderDep,
    admin: AdminDep,
    owner: Owner = None,
) -> list[ShareOut]:
    registry.share(db, admin, name, owner, reader)
    return registry.shares(session, admin, name, owner)


@router.delete(
    "/{name}/shares/{reader}",
    status_code=204,
    responses={**ERRORS, **NOT_ADMIN},
    summary="Stop sharing a model with a key (admins)",
)
def delete_share(
    name: ModelName, reader: Reader, db: DatabaseDep, admin: AdminDep, owner: Owner = None
) -> Response:
    registry.unshare(db, admin, name, owner, reader)
    return Response(status_code=204)

"""A registered model served: its file downloaded, images classified, by alias
(/models/{name}@{alias}/...) or by version (/models/{name}/versions/{n}/...). Each is
what the version's job's route does (GET /jobs/{id}/model, POST /jobs/{id}/predict), once
the version is resolved (api.model_access). See docs/registry.md."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from api.auth import Caller
from api.deps import CallerDep, DatabaseDep, DownloadsDep, ParsersDep, ReaderDep, SettingsDep
from api.inference import Answer, classify
from api.model_access import Ref
from api.parsers import Parsers
from api.reads import read
from api.registry_schemas import ModelPredictOut
from api.responses import Responses
from api.routes.jobs import MODEL_RESPONSES
from api.routes.predict import MAX_BODY_BYTES, PREDICT_BODY, PREDICT_RESPONSES, Invert, TopK
from api.routes.registry import (
    NO_MODEL,
    AliasName,
    Format,
    IfNoneMatch,
    ModelName,
    Owner,
    VersionNumber,
)
from api.services import registry
from api.services.models import send_model
from api.services.predict import read_images
from api.slots import KeySlots
from core.config import Settings
from core.db import Database
from core.spec import ExportFormat

router = APIRouter(prefix="/models", tags=["models"])

DOWNLOAD_RESPONSES: Responses = {
    **MODEL_RESPONSES,
    **NO_MODEL,
    200: {
        **MODEL_RESPONSES[200],
        "description": "The version's model file, named <model>-v<version>.<suffix>; its "
        "ETag is its sha256, `X-Model-Version` the version an alias resolved to.",
    },
}
VERSION_PREDICT_RESPONSES: Responses = {**PREDICT_RESPONSES, **NO_MODEL}
PREDICT_TEXT = (
    "The version's job's model, exactly as POST /jobs/{id}/predict runs it (its body, bounds "
    "and answer), with the model's name, the version that answered and its job."
)


@router.api_route(
    "/{name}@{alias}/model",
    methods=["GET", "HEAD"],
    responses=DOWNLOAD_RESPONSES,
    summary="Download the model of the version an alias points at",
    description="What GET /jobs/{id}/model sends for the version's job. A service that "
    "downloads by alias gets each new version once the alias moves to it (`If-None-Match` "
    "with the last ETag: 304 while it has not).",
)
def download_by_alias(
    name: ModelName,
    alias: AliasName,
    request: Request,
    session: ReaderDep,
    db: DatabaseDep,
    settings: SettingsDep,
    slots: DownloadsDep,
    caller: CallerDep,
    owner: Owner = None,
    format: Format = None,
    if_none_match: IfNoneMatch = None,
) -> Response:
    ref = Ref(name, owner, alias=alias)
    return _download(ref, request, session, db, settings, slots, caller, format, if_none_match)


@router.post(
    "/{name}@{alias}/predict",
    response_model=ModelPredictOut,
    max_body_size=MAX_BODY_BYTES,
    responses=VERSION_PREDICT_RESPONSES,
    summary="Classify images with the version an alias points at",
    description=PREDICT_TEXT,
    openapi_extra=PREDICT_BODY,
)
async def predict_by_alias(
    name: ModelName,
    alias: AliasName,
    request: Request,
    db: DatabaseDep,
    parsers: ParsersDep,
    caller: CallerDep,
    owner: Owner = None,
    invert: Invert = False,
    k: TopK = None,
) -> ModelPredictOut:
    return await _predict(Ref(name, owner, alias=alias), request, db, parsers, caller, invert, k)


@router.api_route(
    "/{name}/versions/{version}/model",
    methods=["GET", "HEAD"],
    responses=DOWNLOAD_RESPONSES,
    summary="Download a version's model",
    description="What GET /jobs/{id}/model sends for the version's job.",
)
def download_version(
    name: ModelName,
    version: VersionNumber,
    request: Request,
    session: ReaderDep,
    db: DatabaseDep,
    settings: SettingsDep,
    slots: DownloadsDep,
    caller: CallerDep,
    owner: Owner = None,
    format: Format = None,
    if_none_match: IfNoneMatch = None,
) -> Response:
    ref = Ref(name, owner, version=version)
    return _download(ref, request, session, db, settings, slots, caller, format, if_none_match)


@router.post(
    "/{name}/versions/{version}/predict",
    response_model=ModelPredictOut,
    max_body_size=MAX_BODY_BYTES,
    responses=VERSION_PREDICT_RESPONSES,
    summary="Classify images with a version's model",
    description=PREDICT_TEXT,
    openapi_extra=PREDICT_BODY,
)
async def predict_version(
    name: ModelName,
    version: VersionNumber,
    request: Request,
    db: DatabaseDep,
    parsers: ParsersDep,
    caller: CallerDep,
    owner: Owner = None,
    invert: Invert = False,
    k: TopK = None,
) -> ModelPredictOut:
    ref = Ref(name, owner, version=version)
    return await _predict(ref, request, db, parsers, caller, invert, k)


def _download(
    ref: Ref,
    request: Request,
    session: Session,
    db: Database,
    settings: Settings,
    slots: KeySlots,
    caller: Caller,
    format: ExportFormat | None,
    if_none_match: str | None,
) -> Response:
    """GET /jobs/{id}/model's answer (api.routes.jobs.get_model) for the version's job."""
    model = registry.version_download(session, caller, ref, format)
    if if_none_match == model.etag:
        headers = {"ETag": model.etag, "X-Model-Version": model.headers["X-Model-Version"]}
        return Response(status_code=304, headers=headers)
    if request.method == "HEAD":
        return Response(headers=model.headers, media_type=model.media_type)
    session.close()  # the copy reads from a snapshot of its own
    return send_model(db, settings, slots, caller.owner, model)


async def _predict(
    ref: Ref,
    request: Request,
    db: Database,
    parsers: Parsers,
    caller: Caller,
    invert: bool,
    k: int | None,
) -> ModelPredictOut:
    """POST /jobs/{id}/predict's work (api.routes.predict) for the version's job: the model
    is found before any of the body is read."""
    found = await read(db, registry.version_target, caller, ref)
    model = found.target
    images = await read_images(
        request, model.shape, invert, parsers.for_key(caller.owner), model.fit
    )
    answer = Answer(classes=model.classes, k=k)
    out = await classify(db, model.job_id, model.format, model.sha256, images, answer)
    return ModelPredictOut.model_validate(
        {
            **out.model_dump(by_alias=True),
            "model": found.name,
            "version": found.version,
            "job_id": model.job_id,
        }
    )

"""The model registry's bodies and answers (/models), documented in OpenAPI at /docs. See
docs/registry.md."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api.inference import PredictOut
from core.spec import ExportFormat

MAX_NUMBER = 2**31 - 1  # the database's integer columns


class RegisterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: uuid.UUID = Field(description="A succeeded job of yours whose model to register.")


class AliasIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, le=MAX_NUMBER, description="The version the alias points at.")
    expected_version: int | None = Field(
        None,
        ge=0,
        le=MAX_NUMBER,
        description="Where you believe the alias points now (0: nowhere, it is new). If it "
        "points elsewhere, another move came first: 409, and nothing changes. Left out: "
        "the alias moves whatever it pointed at.",
    )


class StoredFormat(BaseModel):
    format: ExportFormat
    sha256: str = Field(description="The file's sha256: its ETag when downloaded.")
    size: int


class Lineage(BaseModel):
    """Where a version came from, copied from its job when it was registered."""

    job_id: str
    spec: dict[str, Any] = Field(description="The job's spec, whole.")
    dataset: str = Field(description="The data set it trained on (a built-in name, or ds:<id>).")
    dataset_sha256: str | None = Field(description="That data set's sha256, as the run read it.")
    metrics: dict[str, Any] | None = Field(description="The job's final metrics (its result).")
    classes: list[str] | None = Field(description="The class names, in class-number order.")
    formats: list[StoredFormat] = Field(description="The model files it stored.")


class VersionLinks(BaseModel):
    self: str
    model: str = Field(description="The model file in `default_format` (?format= for another).")
    models: dict[str, str] = Field(description="Per format, its download.")
    predict: str
    job: str


class VersionOut(BaseModel):
    model: str = Field(description="The model's name.")
    owner: str
    version: int
    job_id: str
    aliases: list[str] = Field(description="The aliases that point at this version now.")
    registered_by: str = Field(description="The owner id of the key that registered it.")
    registered_at: dt.datetime
    default_format: ExportFormat | None
    lineage: Lineage
    links: VersionLinks


class AliasOut(BaseModel):
    alias: str
    version: int
    moved_by: str = Field(description="The owner id of the key that last moved it.")
    moved_at: dt.datetime


class AliasMoveOut(BaseModel):
    from_version: int | None = Field(description="null: the alias was made by this move.")
    to_version: int | None = Field(description="null: the alias was removed by this move.")
    moved_by: str
    moved_at: dt.datetime


class AliasDetail(AliasOut):
    history: list[AliasMoveOut] = Field(description="Its moves, newest first.")


class AliasMovedOut(BaseModel):
    alias: str
    version: int | None
    previous_version: int | None
    moved: bool = Field(description="False: it pointed at this version already.")
    moved_by: str
    moved_at: dt.datetime


class ModelLinks(BaseModel):
    self: str
    latest: str = Field(description="The newest version, whatever it is (`@latest`).")


class ModelOut(BaseModel):
    name: str
    owner: str
    read_only: bool = Field(
        description="Shared with this key by an admin: it may download and predict, never "
        "register, move an alias or delete."
    )
    created_by: str
    created_at: dt.datetime
    version_count: int
    latest_version: int | None
    aliases: list[AliasOut]
    links: ModelLinks


class ModelPage(BaseModel):
    items: list[ModelOut]
    next: str | None = Field(description="Pass as `cursor` for the next page; null: the last.")


class ModelDetail(ModelOut):
    versions: list[VersionOut] = Field(description="Newest first, at most `limit`.")
    next_before: int | None = Field(
        description="Pass as `before` for older versions; null: none are left."
    )


class ShareOut(BaseModel):
    reader: str = Field(description="The owner id of the key it is shared with.")
    shared_by: str
    shared_at: dt.datetime


class ModelPredictOut(PredictOut):
    model: str
    version: int = Field(description="The version that answered (where the alias pointed).")
    job_id: str

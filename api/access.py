"""What a caller may see, looked up (api.auth.Caller.can_see): another owner's job or data
set is answered exactly like a missing one. See docs/api.md."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import Query
from sqlalchemy.orm import Session

from api.auth import Caller
from core.db import Job, UserDataset
from core.errors import InvalidRequest, NotFound
from core.model_sizes import model_too_large
from core.spec import JobSpec, user_dataset_id
from core.store import get_dataset, get_job, job_access, start_weights

MIN_ID_PREFIX = 4
# `trainq` and the dashboard show ids by their first characters: a listing narrowed to the
# caller's own ids that start so is how a client finds the whole id (a short prefix would
# list nearly everything).
IdPrefix = Annotated[
    str | None,
    Query(
        min_length=MIN_ID_PREFIX,
        max_length=36,
        pattern=r"^[0-9a-fA-F-]+$",
        description=f"Only ids that start with this ({MIN_ID_PREFIX} characters or more).",
    ),
]


def visible_job(session: Session, caller: Caller, job_id: uuid.UUID) -> Job:
    """The job, if this caller may see it; 404 otherwise."""
    job = get_job(session, job_id=str(job_id))
    if job is None or not caller.can_see(job.owner):
        raise NotFound(f"no job {job_id}")
    return job


def visible_status(session: Session, caller: Caller, job_id: str) -> str:
    """visible_job's check for routes that need only the status (no JSON columns loaded)."""
    row = job_access(session, job_id=job_id)
    if row is None or not caller.can_see(row.owner):
        raise NotFound(f"no job {job_id}")
    return str(row.status)


def visible_dataset(session: Session, caller: Caller, dataset_id: str) -> UserDataset | None:
    """The data set, if this caller may see (and so train on) it."""
    ds = get_dataset(session, dataset_id=dataset_id)
    if ds is None or not caller.can_see(ds.owner):
        return None
    return ds


def check_dataset(session: Session, caller: Caller, spec: JobSpec) -> None:
    """An uploaded data set ("ds:<id>") must exist and be visible to the caller; 422 on the
    field otherwise (another owner's set is reported exactly like a missing one)."""
    ds_id = user_dataset_id(spec.dataset)
    if ds_id is None:
        return
    ds = visible_dataset(session, caller, ds_id)
    if ds is None:
        raise InvalidRequest([no_dataset(spec)])
    c, h, w = ds.image_shape
    too_large = model_too_large(spec, (c, h, w), ds.num_classes)
    if too_large:
        raise InvalidRequest([{"loc": ["body"], "msg": too_large, "type": "model_too_large"}])


def no_dataset(spec: JobSpec) -> dict[str, Any]:
    return {
        "loc": ["body", "dataset"],
        "msg": f"no data set {user_dataset_id(spec.dataset)}: upload one with POST /datasets, "
        "or list yours with GET /datasets",
        "type": "dataset_not_found",
        "input": spec.dataset,
    }


def check_start(session: Session, caller: Caller, spec: JobSpec, loc: tuple[str, ...]) -> None:
    """init_from must name one of the caller's own succeeded jobs, of the spec's
    architecture; 422 on the field otherwise (another owner's job reads as a missing one)."""
    if spec.init_from is None:
        return
    found = start_weights(session, job_id=spec.init_from, owner=caller.owner)
    problem = None
    if found is None:
        problem = (
            f"no succeeded job {spec.init_from} of yours with trained weights: name one "
            "of your own succeeded jobs (GET /jobs?status=succeeded)"
        )
    elif found.model != spec.model:
        problem = f"job {spec.init_from} trained a {found.model}: set model {found.model!r}"
    if problem:
        error = {"loc": [*loc, "init_from"], "msg": problem, "type": "init_from"}
        raise InvalidRequest([{**error, "input": spec.init_from}])

"""What a caller may see, looked up (api.auth.Caller.can_see): another owner's job or data
set is answered exactly like a missing one. See docs/api.md."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import Query
from sqlalchemy.orm import Session

from api.auth import Caller
from core.db import Job, UserDataset
from core.errors import InvalidRequest, NotFound, PretrainedWeightsInvalid
from core.model_sizes import model_too_large
from core.model_starts import Shape, start_problem
from core.spec import BUILT_IN_IMAGES, JobSpec, user_dataset_id
from core.store import get_dataset, get_job, job_access, start_source
from core.store.results import StartSource
from core.torchvision_weights import TORCHVISION_WEIGHTS, check_weights_file

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


def spec_images(
    session: Session, caller: Caller, spec: JobSpec, loc: tuple[str, ...] = ("body",)
) -> tuple[Shape, int]:
    """The (C, H, W) and classes of the spec's data set. An uploaded one ("ds:<id>") must
    exist and be visible to the caller; 422 on the field at `loc` otherwise (another owner's
    set is reported exactly like a missing one)."""
    ds_id = user_dataset_id(spec.dataset)
    if ds_id is None:
        return BUILT_IN_IMAGES
    ds = visible_dataset(session, caller, ds_id)
    if ds is None:
        raise InvalidRequest([{**no_dataset(spec), "loc": [*loc, "dataset"]}])
    c, h, w = ds.image_shape
    return (c, h, w), ds.num_classes


def check_job(session: Session, caller: Caller, spec: JobSpec) -> None:
    """What POST /jobs checks in the database: an uploaded set the caller may see, the
    model fitting its images, and a start the model can load (Starts); 422 otherwise."""
    shape, classes = spec_images(session, caller, spec)
    too_large = user_dataset_id(spec.dataset) is not None and model_too_large(spec, shape, classes)
    if too_large:
        raise InvalidRequest([{"loc": ["body"], "msg": too_large, "type": "model_too_large"}])
    check_start(Starts(session, caller, shape), spec, ("body",))


def no_dataset(spec: JobSpec) -> dict[str, Any]:
    return {
        "loc": ["body", "dataset"],
        "msg": f"no data set {user_dataset_id(spec.dataset)}: upload one with POST /datasets, "
        "or list yours with GET /datasets",
        "type": "dataset_not_found",
        "input": spec.dataset,
    }


class Starts:
    """Whether specs on images of `shape` may start from the jobs their init_from names: one
    of the caller's own succeeded jobs, whose weights fit the spec's model
    (core.model_starts); each job looked up once."""

    def __init__(self, session: Session, caller: Caller, shape: Shape) -> None:
        self._session, self._owner, self._shape = session, caller.owner, shape
        self._sources: dict[str, StartSource | None] = {}

    def problem(self, spec: JobSpec) -> str | None:
        """Why `spec` may not start from its init_from, or None."""
        job_id = spec.init_from
        if job_id is None:
            return None
        if job_id not in self._sources:
            found = start_source(self._session, job_id=job_id, owner=self._owner)
            self._sources[job_id] = found
        source = self._sources[job_id]
        if source is None:
            return (
                f"no succeeded job {job_id} of yours with trained weights: name one "
                "of your own succeeded jobs (GET /jobs?status=succeeded)"
            )
        return start_problem(job_id, source.spec, source.image_shape, spec, self._shape)


def check_start(starts: Starts, spec: JobSpec, loc: tuple[str, ...]) -> None:
    """Starts' check of the spec; 422 on its init_from, under `loc`, when it fails."""
    problem = starts.problem(spec)
    if problem and spec.init_from is not None:
        raise InvalidRequest([start_refused(loc, problem, spec.init_from)])


def start_refused(loc: tuple[str, ...], problem: str, job_id: str) -> dict[str, Any]:
    return {"loc": [*loc, "init_from"], "msg": problem, "type": "init_from", "input": job_id}


def check_pretrained(spec: JobSpec, loc: tuple[str, ...]) -> None:
    """pretrained torchvision weights must be installed in this API's TORCH_HOME and verify
    (core.torchvision_weights); 422 on the field, saying how to install them, otherwise.
    Blocking (a file's first check hashes it): call it off the event loop. The worker checks
    its own TORCH_HOME again before it trains."""
    if not spec.pretrained or spec.model not in TORCHVISION_WEIGHTS:
        return
    try:
        check_weights_file(spec.model)
    except PretrainedWeightsInvalid as e:
        error = {"loc": [*loc, "pretrained"], "msg": e.message, "type": e.code}
        raise InvalidRequest([{**error, "input": True}]) from None

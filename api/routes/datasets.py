"""/datasets: upload a data set of one's own, list them, inspect one, delete one. The work
is in api.services.datasets. See docs/datasets.md."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Response, UploadFile

from api.access import visible_dataset
from api.body import BODY_SLACK, refuse_large_file
from api.deps import CallerDep, ParsersDep, ReaderDep, SessionDep, SettingsDep, UploadsDep
from api.photo_sets import PhotoOptions
from api.responses import NO_DATASET, NO_KEY, TOO_LARGE, problem
from api.schemas import DatasetOut, QuotaProblem
from api.services import datasets
from api.services.datasets import dataset_out, no_such_dataset
from core.datasets import MAX_SIDE, MAX_UPLOAD_BYTES, MIN_SIDE
from core.errors import NotFound
from core.store import dataset_thumbnail, list_datasets
from core.text import PLAIN_PATTERN

Fit = Literal["pad", "crop", "stretch"]
SIZE_HELP = (
    "Photos: the side of the square every image is made (4 to 256). Default: the images' "
    "own where all are one square size, else the median of their longer sides, at most 64."
)
FIT_HELP = "Photos: pad (whole image, black bars), crop (centre square) or stretch."
VAL_HELP = "Photos without train/ and val/ folders: the share of each class held out to val."
SKIP_HELP = "Photos: leave out files that are not usable images (listed in `skipped`)."
router = APIRouter(prefix="/datasets", tags=["datasets"])
ERRORS = {**NO_KEY, **NO_DATASET}
DatasetId = Annotated[uuid.UUID, "a data set id"]
UPLOAD_RESPONSES = {
    **ERRORS,
    **TOO_LARGE,
    422: {"description": "Not a usable data set; `detail[].msg` says why."},
    429: {
        "model": QuotaProblem,
        "description": "Past max_dataset_bytes, or too many uploads at once on this API "
        "process (upload_max_per_key for one key, max_parallel_uploads for all, with "
        "Retry-After).",
    },
}


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    max_body_size=MAX_UPLOAD_BYTES + BODY_SLACK,  # above the app's 1 MiB
    responses=UPLOAD_RESPONSES,
    summary="Upload a data set",
    description="Multipart: `file` and `name`, and for photos `image_size`, `fit`, "
    "`val_fraction`, `skip_bad`. The file is an .npz (uint8 `x_train`, `x_test` images "
    "(N,H,W), (N,H,W,C) or (N,C,H,W), C 1 or 3, integer `y_train`, `y_test` labels); or a zip "
    "or tar(.gz) of photos in `<class>/<image>` folders, with or without one top folder, "
    "split as its `train/`, `val/` (and `test/`) folders give, else stratified by "
    "`val_fraction` (PNG, JPEG, WebP, BMP, TIFF, GIF; each resized once to `image_size` by "
    "`fit`; bad images refused by name, or skipped with `skip_bad`); or a zip of the four "
    "MNIST IDX files, .gz or not. At most 200 MiB, `upload_max_images` images (100,000 "
    "unless configured; more are refused with 413 before any is read), 2 to 1,000 classes, "
    "every class with train images and a val split that is not empty, 1 GiB of pixels, "
    "nothing expanding over 100 times; refused when nothing can be learnt from it (one "
    "value everywhere, one image, one class). Past the uploads parsed at once (one key's "
    "share, `upload_max_per_key`, or the process's, `max_parallel_uploads`), 429 with "
    "Retry-After; past the key's bytes of data sets (`max_dataset_bytes`, counted as "
    "stored: the canonical .npz), 429. The answer names the classes, their counts per "
    "split, the per-channel mean and std, the preprocessing and what was skipped. Train on "
    'it with `"dataset": "ds:<id>"`.',
)
def upload_dataset(
    file: Annotated[UploadFile, File(description="The .npz, .zip or .tar.gz.")],
    name: Annotated[str, Form(min_length=1, max_length=200, pattern=PLAIN_PATTERN)],
    response: Response,
    session: SessionDep,
    caller: CallerDep,
    settings: SettingsDep,
    slots: UploadsDep,
    parsers: ParsersDep,
    image_size: Annotated[int | None, Form(ge=MIN_SIDE, le=MAX_SIDE, description=SIZE_HELP)] = None,
    fit: Annotated[Fit, Form(description=FIT_HELP)] = "pad",
    val_fraction: Annotated[float, Form(gt=0, lt=1, description=VAL_HELP)] = 0.2,
    skip_bad: Annotated[bool, Form(description=SKIP_HELP)] = False,
) -> DatasetOut:
    # A sync route: FastAPI runs it in the threadpool, so reading and parsing never block
    # the event loop. The body is already spooled (and capped by max_body_size).
    refuse_large_file(file, MAX_UPLOAD_BYTES, "file", f"{MAX_UPLOAD_BYTES} (200 MiB)")
    options = PhotoOptions(image_size, fit, val_fraction, skip_bad)
    ds = datasets.upload(session, settings, slots, parsers, caller, file, name, options)
    response.headers["Location"] = f"/datasets/{ds.id}"
    return dataset_out(ds)


@router.get(
    "", response_model=list[DatasetOut], responses=ERRORS, summary="List data sets, newest first"
)
def get_datasets(session: ReaderDep, caller: CallerDep) -> list[DatasetOut]:
    rows = list_datasets(session, owner=caller.owner, all_owners=caller.admin)
    return [dataset_out(ds) for ds in rows]


@router.get("/{dataset_id}", response_model=DatasetOut, responses=ERRORS, summary="One data set")
def get_one_dataset(dataset_id: DatasetId, session: ReaderDep, caller: CallerDep) -> DatasetOut:
    ds = visible_dataset(session, caller, str(dataset_id))
    if ds is None:
        raise no_such_dataset(dataset_id)
    return dataset_out(ds)


@router.get(
    "/{dataset_id}/thumbnails/{label}/{k}.png",
    response_class=Response,
    responses={**ERRORS, 200: {"content": {"image/png": {}}}},
    summary="A thumbnail of a photo set's class",
    description="The k-th (0 to 2) train image of class `label`, as stored (a PNG); the "
    "paths are listed in the set's `thumbnails`.",
)
def get_thumbnail(
    dataset_id: DatasetId, label: int, k: int, session: ReaderDep, caller: CallerDep
) -> Response:
    if visible_dataset(session, caller, str(dataset_id)) is None:
        raise no_such_dataset(dataset_id)
    png = dataset_thumbnail(session, dataset_id=str(dataset_id), label=label, k=k)
    if png is None:
        raise NotFound(f"data set {dataset_id} has no thumbnail {label}/{k}")
    return Response(png, media_type="image/png", headers={"Cache-Control": "private"})


@router.delete(
    "/{dataset_id}",
    status_code=204,
    responses={**ERRORS, 409: problem("A queued or running job trains on it.")},
    summary="Delete a data set",
    description="Refused with 409 while a queued or running job trains on it (the detail "
    "names them); a job submitted at the same moment either is seen and refuses the "
    "deletion, or finds the set gone (422).",
)
def delete_one_dataset(dataset_id: DatasetId, session: SessionDep, caller: CallerDep) -> Response:
    if visible_dataset(session, caller, str(dataset_id)) is None:
        raise no_such_dataset(dataset_id)
    datasets.delete(session, str(dataset_id))
    return Response(status_code=204)

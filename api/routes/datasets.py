"""/datasets: upload a data set of one's own, list them, inspect one, delete one.

An upload is an .npz, a zip of one folder of images per class, or a zip of the four MNIST
IDX files (core.datasets checks it and makes the canonical .npz that training reads). The
same keys and tenancy as jobs: each key sees its own data sets (others' are 404), admins
see all."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, HTTPException, Request, Response, UploadFile

from api.access import visible_dataset
from api.body import BODY_SLACK, refuse_large_file
from api.deps import CallerDep, ReaderDep, SessionDep, SettingsDep
from api.schemas import DatasetOut, Problem, QuotaProblem
from api.slots import KeySlots, SlotLimit
from api.uploads import parse_upload
from core.config import Settings
from core.datasets import MAX_UPLOAD_BYTES, ParsedDataset
from core.db import UserDataset, as_utc
from core.errors import DatasetInUse, DatasetTooLarge, InvalidDataset
from core.quotas import check_dataset_room, lock_owner
from core.spec import USER_DATASET_PREFIX
from core.store import create_dataset, list_datasets
from core.store.deletion import delete_unused_dataset
from core.text import PLAIN_PATTERN

router = APIRouter(prefix="/datasets", tags=["datasets"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "Missing or unknown API key."},
    404: {"model": Problem, "description": "No such data set (or not yours)."},
}
DatasetId = Annotated[uuid.UUID, "a data set id"]


def upload_slots(settings: Settings) -> KeySlots:
    """The uploads this process parses at once, per key (upload_max_per_key) and in all
    (max_parallel_uploads): each may hold a few times its decompressed size in memory, so
    their number bounds the memory uploads can take; a key's share, below the process's
    limit, leaves the other slots to other keys however long its own uploads take."""
    return KeySlots(
        "uploads being checked",
        per_key=SlotLimit("upload_max_per_key", settings.upload_max_per_key),
        per_process=SlotLimit("max_parallel_uploads", settings.max_parallel_uploads),
    )


def dataset_out(ds: UserDataset) -> DatasetOut:
    return DatasetOut.model_validate(
        {
            "id": ds.id,
            "name": ds.name,
            "dataset": f"{USER_DATASET_PREFIX}{ds.id}",
            "sha256": ds.sha256,
            "size": ds.size,
            "image_shape": ds.image_shape,
            "num_classes": ds.num_classes,
            "train_count": ds.train_count,
            "test_count": ds.test_count,
            "created_at": as_utc(ds.created_at),
        }
    )


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    max_body_size=MAX_UPLOAD_BYTES + BODY_SLACK,  # above the app's 1 MiB
    responses={
        **ERRORS,
        413: {"model": Problem, "description": "Over a size limit (bytes, images, zip bomb)."},
        422: {"description": "Not a usable data set; `detail[].msg` says why."},
        429: {
            "model": QuotaProblem,
            "description": "Past max_dataset_bytes, or too many uploads at once on this API "
            "process (upload_max_per_key for one key, max_parallel_uploads for all, with "
            "Retry-After).",
        },
    },
    summary="Upload a data set",
    description="Multipart: `file` (an .npz with uint8 `x_train`, `x_test` images "
    "(N,H,W), (N,H,W,C) or (N,C,H,W), C 1 or 3, and integer `y_train`, `y_test` labels; or a "
    "zip of `<class_name>/<image>.png|jpg` folders, split 80/20 per class; or a zip of the four "
    "MNIST IDX files, .gz or not) and `name`. At most 200 MiB, `upload_max_images` images "
    "(100,000 unless configured; more are refused with 413 before any is read) of at most "
    "256×256, 2 to 1,000 classes, 1 GiB of pixels, nothing expanding over 100 times; refused "
    "when nothing can be learnt from it (one value everywhere, one image, one class). Past "
    "the uploads parsed at once (one key's share, `upload_max_per_key`, or the process's, "
    "`max_parallel_uploads`), 429 with Retry-After; past the key's bytes of data sets "
    "(`max_dataset_bytes`, counted as stored: the canonical .npz), 429. Train on it with "
    '`"dataset": "ds:<id>"`.',
)
def upload_dataset(
    file: Annotated[UploadFile, File(description="The .npz or .zip.")],
    name: Annotated[str, Form(min_length=1, max_length=200, pattern=PLAIN_PATTERN)],
    request: Request,
    response: Response,
    session: SessionDep,
    caller: CallerDep,
    settings: SettingsDep,
) -> DatasetOut:
    # A sync route: FastAPI runs it in the threadpool, so reading and parsing never block
    # the event loop. The body is already spooled (and capped by max_body_size).
    refuse_large_file(file, MAX_UPLOAD_BYTES, "file", f"{MAX_UPLOAD_BYTES} (200 MiB)")
    limited = caller.quota_owner
    if limited is not None:
        # No parse for a key with no room left at all. Only then: the stored set (the
        # canonical, compressed .npz) may be smaller than the upload, so its size is known
        # only after the parse.
        check_dataset_room(session, settings, limited, 1)
        session.rollback()  # no transaction (SQLite: no write lock) held through the parse
    slots: KeySlots = request.app.state.uploads
    with slots.held(caller.owner):  # 429 past the key's share or the process's limit
        parsed = _parse(file, settings.upload_max_images)
    if limited is not None:  # again, on the stored size, under the owner's lock
        lock_owner(session, limited)
        check_dataset_room(session, settings, limited, len(parsed.npz))
    ds = create_dataset(
        session, dataset_id=str(uuid.uuid4()), owner=caller.owner, name=name, parsed=parsed
    )
    session.commit()
    response.headers["Location"] = f"/datasets/{ds.id}"
    return dataset_out(ds)


def _parse(file: UploadFile, max_images: int) -> ParsedDataset:
    try:
        return parse_upload(file.file.read(MAX_UPLOAD_BYTES + 1), max_images=max_images)
    except DatasetTooLarge as e:
        raise HTTPException(413, detail=e.message) from e
    except InvalidDataset as e:
        problem = {"type": e.code, "loc": ["body", "file"], "msg": e.message}
        raise HTTPException(422, detail=[problem]) from e


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
        raise HTTPException(404, detail=f"no data set {dataset_id}")
    return dataset_out(ds)


@router.delete(
    "/{dataset_id}",
    status_code=204,
    responses={
        **ERRORS,
        409: {"model": Problem, "description": "A queued or running job trains on it."},
    },
    summary="Delete a data set",
    description="Refused with 409 while a queued or running job trains on it (the detail "
    "names them); a job submitted at the same moment either is seen and refuses the "
    "deletion, or finds the set gone (422).",
)
def delete_one_dataset(dataset_id: DatasetId, session: SessionDep, caller: CallerDep) -> Response:
    if visible_dataset(session, caller, str(dataset_id)) is None:
        raise HTTPException(404, detail=f"no data set {dataset_id}")
    users = delete_unused_dataset(session, dataset_id=str(dataset_id))
    if users:
        session.rollback()
        raise DatasetInUse(
            f"data set {dataset_id} is used by queued or running jobs ({', '.join(users)}): "
            "cancel them or wait for them to end, then delete it"
        )
    session.commit()
    return Response(status_code=204)

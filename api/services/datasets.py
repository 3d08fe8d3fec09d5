"""What the /datasets routes do: an upload checked against the key's room, parsed within
the upload slots (api.uploads, api.slots) and stored; a data set as the API shows it; a
deletion refused while a job trains on it. See docs/datasets.md."""

from __future__ import annotations

import uuid

from fastapi import UploadFile
from sqlalchemy.orm import Session

from api.auth import Caller
from api.errors import RETRY_AFTER_S
from api.parser_pool import PoolBusy
from api.parsers import Parsers
from api.photo_sets import THUMBS_PER_CLASS, PhotoOptions
from api.schemas import DatasetOut
from api.slots import KeySlots, SlotLimit
from core.config import Settings
from core.datasets import MAX_UPLOAD_BYTES, ParsedDataset
from core.db import UserDataset, as_utc
from core.errors import (
    DatasetInUse,
    DatasetTooLarge,
    InvalidDataset,
    InvalidRequest,
    NotFound,
    ProcessBusy,
    TooLarge,
)
from core.quotas import check_dataset_room, lock_owner
from core.spec import USER_DATASET_PREFIX
from core.store import create_dataset
from core.store.deletion import delete_unused_dataset


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
            "classes": ds.classes,
            "class_counts": ds.class_counts,
            "holdout_count": ds.holdout_count,
            "mean": ds.mean,
            "std": ds.std,
            "preprocessing": ds.preprocessing,
            "skipped": ds.skipped,
            "thumbnails": _thumbnail_paths(ds),
        }
    )


def _thumbnail_paths(ds: UserDataset) -> list[list[str]] | None:
    """Where each class's thumbnails are served (GET /datasets/{id}/thumbnails/{k}/{i}.png),
    from the train counts: a photo set keeps the first THUMBS_PER_CLASS of each class."""
    if ds.preprocessing is None or ds.class_counts is None:
        return None
    return [
        [f"/datasets/{ds.id}/thumbnails/{k}/{i}.png" for i in range(min(n, THUMBS_PER_CLASS))]
        for k, n in enumerate(ds.class_counts.get("train", []))
    ]


def upload(
    session: Session,
    settings: Settings,
    slots: KeySlots,
    parsers: Parsers,
    caller: Caller,
    file: UploadFile,
    name: str,
    options: PhotoOptions,
) -> UserDataset:
    """The upload parsed and stored, committed. A key with limits is checked twice: for any
    room before the parse (no parse for a key with none), and for the stored size after it
    (the canonical, compressed .npz may be smaller than the upload), under its lock."""
    limited = caller.quota_owner
    if limited is not None:
        check_dataset_room(session, settings, limited, 1)
        session.rollback()  # no transaction (SQLite: no write lock) held through the parse
    with slots.held(caller.owner):  # ProcessBusy past the key's share or the process's limit
        parsed = _parse(parsers, caller.owner, file, settings.upload_max_images, options)
    if limited is not None:
        lock_owner(session, limited)
        check_dataset_room(session, settings, limited, len(parsed.npz))
    ds = create_dataset(
        session, dataset_id=str(uuid.uuid4()), owner=caller.owner, name=name, parsed=parsed
    )
    session.commit()
    return ds


def _parse(
    parsers: Parsers, owner: str, file: UploadFile, max_images: int, options: PhotoOptions
) -> ParsedDataset:
    """The upload read in a parser child (api.parsers): 413 or 422 naming the problem."""
    try:
        data = file.file.read(MAX_UPLOAD_BYTES + 1)
        if len(data) > MAX_UPLOAD_BYTES:
            raise DatasetTooLarge(f"the upload is over {MAX_UPLOAD_BYTES} bytes")
        return parsers.upload(data, max_images, options)
    except PoolBusy as e:
        raise ProcessBusy(
            f"{e}: retry shortly", limit="max_parallel_uploads",
            value=parsers.upload_pool.size, owner=owner, retry_after_s=int(RETRY_AFTER_S),
        ) from e  # fmt: skip
    except DatasetTooLarge as e:
        raise TooLarge(e.message) from e
    except InvalidDataset as e:
        problem = {"type": e.code, "loc": ["body", "file"], "msg": e.message}
        raise InvalidRequest([problem]) from e


def delete(session: Session, dataset_id: str) -> None:
    """Delete the data set, committed; DatasetInUse while a queued or running job trains on
    it."""
    users = delete_unused_dataset(session, dataset_id=dataset_id)
    if users:
        session.rollback()
        raise DatasetInUse(
            f"data set {dataset_id} is used by queued or running jobs ({', '.join(users)}): "
            "cancel them or wait for them to end, then delete it"
        )
    session.commit()


def no_such_dataset(dataset_id: object) -> NotFound:
    return NotFound(f"no data set {dataset_id}")

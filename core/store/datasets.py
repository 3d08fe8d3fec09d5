"""Uploaded data sets (POST /datasets): immutable once stored. See docs/datasets.md."""

from __future__ import annotations

import base64
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.datasets import ParsedDataset
from core.db import UserDataset, allow_time_for


def create_dataset(
    s: Session, *, dataset_id: str, owner: str | None, name: str, parsed: ParsedDataset
) -> UserDataset:
    """The row of an upload that api.uploads checked and made canonical."""
    ds = UserDataset(
        id=dataset_id,
        owner=owner,
        name=name,
        sha256=parsed.sha256,
        size=len(parsed.npz),
        image_shape=list(parsed.image_shape),
        num_classes=parsed.num_classes,
        train_count=parsed.train_count,
        test_count=parsed.test_count,
        data=parsed.npz,
        classes=None if parsed.classes is None else list(parsed.classes),
        class_counts=parsed.class_counts,
        holdout_count=parsed.holdout_count,
        mean=list(parsed.mean),
        std=list(parsed.std),
        preprocessing=parsed.preprocessing,
        skipped=parsed.skipped,
        thumbnails=parsed.thumbnails,
    )
    allow_time_for(s, len(parsed.npz))
    s.add(ds)
    s.flush()
    return ds


def dataset_thumbnail(s: Session, *, dataset_id: str, label: int, k: int) -> bytes | None:
    """The k-th thumbnail of class `label` (a PNG), if the set has it."""
    thumbs = s.scalar(select(UserDataset.thumbnails).where(UserDataset.id == dataset_id))
    if not thumbs or not 0 <= label < len(thumbs) or not 0 <= k < len(thumbs[label]):
        return None
    return base64.b64decode(thumbs[label][k])


def get_dataset(s: Session, *, dataset_id: str) -> UserDataset | None:
    """The metadata; `.data` (the .npz) loads on first access."""
    return s.get(UserDataset, dataset_id)


def list_datasets(s: Session, *, owner: str | None, all_owners: bool) -> Sequence[UserDataset]:
    """Newest first, without their data."""
    q = select(UserDataset)
    if not all_owners:
        q = q.where(UserDataset.owner == owner)
    return s.scalars(q.order_by(UserDataset.created_at.desc(), UserDataset.id.desc())).all()


def dataset_data(s: Session, *, dataset_id: str) -> tuple[str, bytes] | None:
    """(sha256, canonical .npz bytes) of a stored data set."""
    size = s.scalar(select(UserDataset.size).where(UserDataset.id == dataset_id))
    if size is None:
        return None
    allow_time_for(s, size)
    row = s.execute(
        select(UserDataset.sha256, UserDataset.data).where(UserDataset.id == dataset_id)
    ).first()
    return None if row is None else (row[0], row[1])

"""Uploaded data sets (POST /datasets): immutable once stored. See docs/datasets.md."""

from __future__ import annotations

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
    )
    allow_time_for(s, len(parsed.npz))
    s.add(ds)
    s.flush()
    return ds


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

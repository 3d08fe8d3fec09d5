"""A job's or a sweep's name, tags and notes changed after it was made (PATCH). A job's tags
are written twice in one transaction: on its row (what it shows) and in job_tags (what the
search finds it by). See docs/api.md ("Names, tags, notes")."""

from __future__ import annotations

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from core.db import Job, JobTag, Sweep
from core.labels import Labels, LabelsPatch, labels_of, name_key
from core.store.jobs import tag_rows


def relabel_job(s: Session, *, job_id: str, patch: LabelsPatch) -> Job | None:
    """The job with `patch` applied (None if it is gone). Its row is held first: two
    changes at once apply one after the other, each to what the other left."""
    job = s.scalars(
        select(Job)
        .where(Job.id == job_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).first()
    if job is None:
        return None
    before = labels_of(job)
    after = patch.applied(before)
    s.execute(
        update(Job).where(Job.id == job_id).values(**_columns(after), name_key=name_key(after.name))
    )
    gone = [t for t in before.tags if t not in after.tags]
    new = [t for t in after.tags if t not in before.tags]
    if gone:
        s.execute(delete(JobTag).where(JobTag.job_id == job_id, JobTag.tag.in_(gone)))
    if new:
        s.execute(insert(JobTag), tag_rows(job, new))
    s.refresh(job)
    return job


def relabel_sweep(s: Session, *, sweep_id: str, patch: LabelsPatch) -> Sweep | None:
    """The sweep with `patch` applied (None if it is gone); its trials keep theirs."""
    sweep = s.scalars(
        select(Sweep)
        .where(Sweep.id == sweep_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).first()
    if sweep is None:
        return None
    after = patch.applied(labels_of(sweep))
    s.execute(update(Sweep).where(Sweep.id == sweep_id).values(**_columns(after)))
    s.refresh(sweep)
    return sweep


def _columns(labels: Labels) -> dict[str, object]:
    return {"name": labels.name, "notes": labels.notes, "tags": list(labels.tags)}

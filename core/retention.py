"""The retention policy: what ended jobs keep, and for how long. Past `TRAINQ_RETENTION_DAYS`
after it ended, a job loses its step rows, checkpoint and model; its row (with
`purged_at`), epochs, result and run record stay. The reconciler runs one bounded pass at a
time (`retention_pass`), which also forgets attempts' training times no quota counts any
more; `trainq gc` runs the same purge to the end. Also here: the bytes trainq holds, by
kind, for the Prometheus gauges. See docs/jobs.md ("Retention and deletion")."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Select, delete, func, select, text, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import (
    Artifact,
    AttemptTime,
    Checkpoint,
    Database,
    Job,
    StepMetric,
    UserDataset,
    db_ago,
    db_now,
)
from core.db.sqlite import free_pages
from core.quotas import orphaned_attempt_times, spent_attempt_times
from core.store.deletion import ENDED, hold_job_id
from core.store.registry import registered

log = logging.getLogger("trainq.retention")
KINDS = ("artifacts", "checkpoints", "step_rows")
DAY_S = 24 * 3600
# Bytes a step row takes on SQLite, its primary-key index included: 161 measured over
# 100,000 rows with GPU-sized memory figures (CPU rows, with zeros, take less). PostgreSQL
# reports its table's size itself (stored_bytes).
STEP_ROW_BYTES = 160


@dataclass
class Footprint:
    """Jobs, and per kind (KINDS) the rows and the bytes they hold."""

    jobs: int = 0
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    def add(self, other: Footprint) -> None:
        self.jobs += other.jobs
        for kind in KINDS:
            self.rows[kind] += other.rows[kind]
            self.bytes[kind] += other.bytes[kind]

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def expired(s: Session, older_than_days: float) -> Select[str]:
    """Ended jobs not purged yet whose end is older than `older_than_days`, oldest first,
    by the database's clock. Only ix_jobs_unpurged_finished serves it, and the cutoff is
    read first and compared as a value, so the walk of the index stops there. A job has a
    finished_at only once it ended (purge_job checks the status again). A job whose model
    is a registered model's version is kept whole while it is one (core.store.registry)."""
    cutoff = s.scalar(select(db_ago(older_than_days * DAY_S)))
    return (
        select(Job.id)
        .where(Job.purged_at.is_(None), Job.finished_at < cutoff, ~registered(Job.id))
        .order_by(Job.finished_at)
    )


def kept_registered(db: Database, *, older_than_days: float) -> int:
    """Ended jobs past the age that `expired` passes over: registered models' versions."""
    with db.reader() as s:
        cutoff = s.scalar(select(db_ago(older_than_days * DAY_S)))
        old = select(Job.id).where(
            Job.purged_at.is_(None), Job.finished_at < cutoff, registered(Job.id)
        )
        return s.scalar(select(func.count()).select_from(old.subquery())) or 0


def footprint(s: Session, jobs: Select[str]) -> Footprint:
    """What the jobs `jobs` selects hold: one aggregate a kind, no blob read."""
    ids = jobs.subquery()
    art_rows, art_bytes = s.execute(
        select(func.count(), func.coalesce(func.sum(func.length(Artifact.data)), 0)).where(
            Artifact.job_id.in_(select(ids.c.id))
        )
    ).one()
    ck_rows, ck_bytes = s.execute(
        select(func.count(), func.coalesce(func.sum(func.length(Checkpoint.data)), 0)).where(
            Checkpoint.job_id.in_(select(ids.c.id))
        )
    ).one()
    steps = s.scalar(select(func.count()).where(StepMetric.job_id.in_(select(ids.c.id)))) or 0
    return Footprint(
        jobs=s.scalar(select(func.count()).select_from(ids)) or 0,
        rows={"artifacts": art_rows, "checkpoints": ck_rows, "step_rows": steps},
        bytes={
            "artifacts": art_bytes,
            "checkpoints": ck_bytes,
            "step_rows": steps * STEP_ROW_BYTES,
        },
    )


def purge_job(s: Session, *, job_id: str) -> bool:
    """An ended job loses its step rows, checkpoint and model; its row records when. False
    (nothing removed) if it is not ended, was purged already, or is a registered model's
    version: the job's id is held first, as a registration holds it, so that one that
    committed meanwhile is seen here (and one that comes after sees the purge)."""
    hold_job_id(s, job_id=job_id)
    marked = s.execute(
        update(Job)
        .where(
            Job.id == job_id,
            Job.status.in_(ENDED),
            Job.purged_at.is_(None),
            ~registered(Job.id),
        )
        .values(purged_at=db_now())
    )
    if not marked.rowcount:  # type: ignore[attr-defined]
        return False
    for table in (StepMetric, Checkpoint, Artifact):
        s.execute(delete(table).where(table.job_id == job_id))
    return True


def purge_batch(db: Database, *, older_than_days: float, limit: int) -> Footprint:
    """At most `limit` expired jobs purged, each in its own transaction; what they held."""
    with db.reader() as s:
        ids: Sequence[str] = s.scalars(expired(s, older_than_days).limit(limit)).all()
    gone = Footprint()
    for job_id in ids:
        with db.writer() as s:
            held = footprint(s, select(Job.id).where(Job.id == job_id))
            if purge_job(s, job_id=job_id):
                gone.add(held)
    return gone


def sweep_checkpoints(db: Database, *, limit: int) -> int:
    """Checkpoints that ended jobs still hold (left by a trainq from before their end took
    them); at most `limit` of them a call."""
    ended = (
        select(Checkpoint.job_id)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Job.status.in_(ENDED))
        .limit(limit)
    )
    with db.reader() as s:  # most passes find none: no write lock taken for nothing
        if s.scalar(ended) is None:
            return 0
    with db.writer() as s:
        ids = s.scalars(ended).all()  # an ended job's checkpoint is never written again
        s.execute(delete(Checkpoint).where(Checkpoint.job_id.in_(ids)))
    return len(ids)


def forget_spent_attempt_times(db: Database, *, limit: int) -> int:
    """Attempts' times that no quota counts any more (core.quotas); at most `limit` of them
    a call. Training hours are kept apart from the jobs they came from, so no deletion or
    purge of a job takes them; this is what keeps their table small."""
    spent = select(AttemptTime.id).where(spent_attempt_times()).limit(limit)
    with db.reader() as s:  # most passes find none: no write lock taken for nothing
        if s.scalar(spent) is None:
            return 0
    with db.writer() as s:
        ids = s.scalars(spent).all()
        s.execute(delete(AttemptTime).where(AttemptTime.id.in_(ids)))
    return len(ids)


def end_orphaned_attempt_times(db: Database, *, limit: int) -> int:
    """Attempts' times still open whose job no longer runs them (core.quotas) end now; at
    most `limit` of them a call."""
    orphans = select(AttemptTime.id).where(orphaned_attempt_times()).limit(limit)
    with db.reader() as s:
        if s.scalar(orphans) is None:
            return 0
    with db.writer() as s:
        ids = s.scalars(orphans).all()  # read again under the write lock: none ends twice
        s.execute(
            update(AttemptTime)
            .where(AttemptTime.id.in_(ids), orphaned_attempt_times())
            .values(ended_at=db_now())
        )
    return len(ids)


def retention_pass(db: Database, settings: Settings) -> None:
    """One bounded pass of the policy, from the reconciler; a failure is the next pass's."""
    try:
        swept = sweep_checkpoints(db, limit=settings.retention_batch)
        end_orphaned_attempt_times(db, limit=settings.retention_batch)
        forget_spent_attempt_times(db, limit=settings.retention_batch)
        gone = Footprint()
        if settings.retention_days is not None:
            gone = purge_batch(
                db, older_than_days=settings.retention_days, limit=settings.retention_batch
            )
        if (swept or gone.jobs) and db.engine.dialect.name == "sqlite":
            free_pages(db.engine)  # else the file keeps its size, its pages free inside it
    except SQLAlchemyError as e:
        log.warning("retention pass skipped (%s); the next one tries again", e)
        return
    except Exception:
        log.exception("retention pass failed; the next one tries again")
        return
    if swept or gone.jobs:
        log.info(
            "retention: purged %d jobs (%d bytes); swept %d checkpoints",
            gone.jobs,
            gone.total_bytes,
            swept,
        )


def collect(db: Database, *, older_than_days: float, batch: int = 100) -> Footprint:
    """`trainq gc`: purge every expired job, a batch at a time; what they held."""
    sweep_checkpoints(db, limit=2**31)
    while end_orphaned_attempt_times(db, limit=batch):
        pass
    while forget_spent_attempt_times(db, limit=batch):
        pass
    total = Footprint()
    while (gone := purge_batch(db, older_than_days=older_than_days, limit=batch)).jobs:
        total.add(gone)
    return total


def plan(db: Database, *, older_than_days: float) -> Footprint:
    """`trainq gc --dry-run`: what `collect` would remove, read without changing anything."""
    with db.reader() as s:
        return footprint(s, expired(s, older_than_days))


def stored_bytes(s: Session) -> dict[str, int]:
    """Bytes held by kind, for the gauges: artifacts, checkpoints, step rows and uploaded
    data sets. A value's length is read from its header (SQLite) or TOAST pointer
    (PostgreSQL), never from its bytes: on SQLite, a column stored after a large value
    (artifacts.size) would cost a walk of all its pages. Step rows: the table's size where
    the database keeps it (PostgreSQL), else the row count times STEP_ROW_BYTES."""
    artifacts = s.scalar(select(func.coalesce(func.sum(func.length(Artifact.data)), 0)))
    checkpoints = s.scalar(select(func.coalesce(func.sum(func.length(Checkpoint.data)), 0)))
    datasets = s.scalar(select(func.coalesce(func.sum(func.length(UserDataset.data)), 0)))
    if s.get_bind().dialect.name == "postgresql":
        steps = s.scalar(text("SELECT pg_total_relation_size('step_metrics')"))
    else:
        steps = (s.scalar(select(func.count()).select_from(StepMetric)) or 0) * STEP_ROW_BYTES
    return {
        "artifacts": int(artifacts or 0),
        "checkpoints": int(checkpoints or 0),
        "step_rows": int(steps or 0),
        "datasets": int(datasets or 0),
    }

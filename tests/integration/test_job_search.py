"""The search behind GET /jobs, on both databases, against the same search done by hand in
Python: every filter and order, page after page from the cursor's position (ties in time
and in figures included), each way of reading a page (through a filter's few jobs, or
walking the order's index), within one owner's jobs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import update

from core.db import Database, Job, JobTag
from core.labels import Labels
from core.spec import JobSpec, JobStatus
from core.store import claim_job, create_job, end_job, save_epoch, succeed_job
from core.store import search as search_module
from core.store.search import JobFilters, Position, Scope, Sort, SortKey, position_of, search_jobs
from core.train import EpochMetrics

BASE = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
STATUSES = [JobStatus.succeeded, JobStatus.succeeded, JobStatus.failed, JobStatus.canceled,
            JobStatus.queued, JobStatus.running, JobStatus.pruned]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Seeded:
    id: str
    owner: str
    status: JobStatus
    tags: tuple[str, ...]
    name: str | None
    dataset: str
    model: str
    created_at: dt.datetime
    sweep_id: str | None
    figures: dict[str, float]


def _tags(i: int) -> tuple[str, ...]:
    tags = []
    for tag, every in (("red", 3), ("blue", 4), ("Red", 5), ("team:x/y-1.2", 7)):
        if i % every == 0:
            tags.append(tag)
    return tuple(tags)


def _name(i: int) -> str | None:
    if i % 9 == 0:
        return f"Straße {i}"  # casefolds to "strasse"
    if i % 6 == 0:
        return f"Résumé {i}"
    return f"Run {i}" if i % 2 == 0 else None


SWEEP = "0a901405-5640-451d-8bea-36107e8561b0"  # fixed: it names parametrized cases


def _seed(db: Database, owner: str, i: int) -> Seeded:
    spec = JobSpec(
        dataset=("mnist-sample", "mnist", "fashion-mnist")[i % 3],
        model="resnet18" if i % 4 == 1 else "cnn",
        epochs=2,
    )
    status = STATUSES[i % len(STATUSES)]
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        create_job(
            s, job_id=job_id, spec=spec, owner=owner, labels=Labels(name=_name(i), tags=_tags(i))
        )
        # Three at each instant: ties the order breaks by id.
        created = BASE + dt.timedelta(seconds=i // 3)
        sweep_id = SWEEP if i % 8 == 0 else None
        s.execute(update(Job).where(Job.id == job_id).values(created_at=created, sweep_id=sweep_id))
        s.execute(update(JobTag).where(JobTag.job_id == job_id).values(created_at=created))
    figures: dict[str, float] = {}
    if status is not JobStatus.queued:
        with db.writer() as s:
            assert claim_job(s, job_id=job_id, worker="w", device="cpu") is not None
    if status is JobStatus.succeeded:
        # Two decimals: ties in figures too.
        figures = {
            "test_accuracy": round(0.9 + (i % 5) / 100, 2),
            "test_loss": round(0.1 + (i % 4) / 100, 2),
            "train_loss": round(0.2 + (i % 3) / 100, 2),
            "images_per_second": float(1000 + 10 * (i % 6)),
            "duration": float(60 + i % 7),
            "train_accuracy": round(0.95 + (i % 2) / 100, 2),
        }
        for epoch, train_accuracy in ((1, 0.5), (2, figures["train_accuracy"])):
            metrics = EpochMetrics(epoch, epoch * 10, 0.3, train_accuracy, 0.2, 0.9, 1.0, 100.0)
            with db.writer() as s:
                save_epoch(s, job_id=job_id, attempt=1, epoch=metrics, steps=[], checkpoint=None)
        result = {k: v for k, v in figures.items() if k not in ("duration", "train_accuracy")}
        result |= {"duration_s": figures["duration"], "epochs": 2, "steps": 20}
        with db.writer() as s:
            assert succeed_job(s, job_id=job_id, attempt=1, result=result, record={}, models=[])
    elif status is not JobStatus.queued and status is not JobStatus.running:
        with db.writer() as s:
            assert end_job(s, job_id=job_id, status=status, code="x", message="y", attempt=1)
    return Seeded(
        job_id, owner, status, _tags(i), _name(i), spec.dataset, spec.model.value, created,
        sweep_id, figures,
    )  # fmt: skip


@pytest.fixture(scope="module")
def seeded(db: Database) -> list[Seeded]:
    """49 jobs of owner a (one in every status, tags, names, data sets, architectures, a
    sweep, figures), and 14 of owner b, which a's searches never see."""
    return [_seed(db, "a", i) for i in range(49)] + [_seed(db, "b", i) for i in range(14)]


def by_hand(jobs: list[Seeded], owner: str | None, f: JobFilters, sort: Sort) -> list[str]:
    """The search, in Python."""

    def keeps(j: Seeded) -> bool:
        name_key = (j.name or "").casefold()
        checks = [
            owner is None or j.owner == owner,
            not f.statuses or j.status in f.statuses,
            all(t in j.tags for t in f.tags),
            f.name_prefix is None
            or (j.name is not None and name_key.startswith(f.name_prefix.casefold())),
            f.dataset is None or j.dataset == f.dataset,
            f.model is None or j.model == f.model,
            f.sweep_id is None or j.sweep_id == f.sweep_id,
            f.id_prefix is None or j.id.startswith(f.id_prefix),
            f.created_after is None or j.created_at >= f.created_after,
            f.created_before is None or j.created_at < f.created_before,
            not sort.key.figure or sort.key.value in j.figures,
        ]
        return all(checks)

    def key(j: Seeded) -> tuple[Any, str]:
        value = j.created_at if sort.key is SortKey.created else j.figures[sort.key.value]
        return value, j.id

    return [j.id for j in sorted(filter(keeps, jobs), key=key, reverse=sort.descending)]


def every_page(db: Database, scope: Scope, f: JobFilters, sort: Sort, limit: int) -> list[str]:
    """Page after page, each from the last one's position, as GET /jobs reads them."""
    seen: list[str] = []
    after: Position | None = None
    while True:
        with db.reader() as s:
            page = search_jobs(s, scope=scope, filters=f, sort=sort, after=after, limit=limit)
            if not page:
                return seen
            seen += [j.id for j in page]
            after = position_of(page[-1], sort)
        assert len(seen) < 200, "the pages never end"


T = BASE + dt.timedelta(seconds=5)
CASES: list[tuple[JobFilters, str]] = [
    (JobFilters(), "-created"),
    (JobFilters(), "created"),
    (JobFilters(statuses=(JobStatus.failed, JobStatus.canceled)), "-created"),
    (JobFilters(tags=("red",)), "-created"),
    (JobFilters(tags=("Red",)), "created"),
    (JobFilters(tags=("red", "blue")), "-created"),
    (JobFilters(tags=("red", "team:x/y-1.2")), "-test_accuracy"),
    (JobFilters(name_prefix="run 1"), "-created"),
    (JobFilters(name_prefix="STRASSE"), "-created"),
    (JobFilters(name_prefix="résumé"), "test_loss"),
    (JobFilters(dataset="mnist"), "-created"),
    (JobFilters(model="resnet18"), "-train_loss"),
    (JobFilters(sweep_id=SWEEP), "-created"),
    (JobFilters(created_after=T, created_before=T + dt.timedelta(seconds=6)), "-created"),
    (JobFilters(created_after=T), "-test_accuracy"),
    (JobFilters(), "-test_accuracy"),
    (JobFilters(), "test_accuracy"),
    (JobFilters(), "-duration"),
    (JobFilters(), "images_per_second"),
    (JobFilters(), "-train_accuracy"),
    (JobFilters(statuses=(JobStatus.failed,)), "-test_accuracy"),
    (JobFilters(statuses=(JobStatus.succeeded, JobStatus.failed), tags=("blue",)), "-test_loss"),
    (JobFilters(tags=("red",), dataset="fashion-mnist", model="cnn"), "-created"),
]


@pytest.fixture(params=["walk", "few"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each way of reading a page: walking the order's index (no filter counts as keeping
    few jobs), or through the jobs of the filter that keeps fewest (every filter does)."""
    monkeypatch.setattr(search_module, "CANDIDATES_MAX", 0 if request.param == "walk" else 10**6)
    yield request.param


@pytest.mark.parametrize(("filters", "sort"), CASES, ids=[f"{f}|{s}" for f, s in CASES])
def test_every_page_holds_what_the_search_by_hand_finds(
    db: Database, seeded: list[Seeded], way: str, filters: JobFilters, sort: str
) -> None:
    order = Sort.parse(sort)
    expected = by_hand(seeded, "a", filters, order)
    for limit in (1, 4, 50):
        assert every_page(db, Scope("a", everyone=False), filters, order, limit) == expected


@pytest.mark.parametrize("sort", ["-created", "-test_accuracy"])
def test_an_admin_searches_everyone_s_jobs(
    db: Database, seeded: list[Seeded], way: str, sort: str
) -> None:
    order = Sort.parse(sort)
    f = JobFilters(tags=("red",))
    assert every_page(db, Scope(None, everyone=True), f, order, 3) == by_hand(
        seeded, None, f, order
    )


def test_a_succeeded_job_keeps_its_final_figures_on_its_row(
    db: Database, seeded: list[Seeded]
) -> None:
    """Its result's, and the last epoch's train accuracy (the first epoch's was 0.5)."""
    done = [j for j in seeded if j.figures]
    with db.reader() as s:
        for j in done:
            row = s.get(Job, j.id)
            assert row is not None
            got = {k.value: getattr(row, k.column.key) for k in SortKey if k.figure}
            assert got == j.figures
            assert (row.dataset, row.model) == (j.dataset, j.model)


def test_jobs_that_did_not_succeed_have_no_figures(db: Database, seeded: list[Seeded]) -> None:
    with db.reader() as s:
        for j in seeded:
            if not j.figures:
                row = s.get(Job, j.id)
                assert row is not None and row.final_test_accuracy is None


def test_a_filter_s_few_jobs_are_counted_on_its_index_and_no_further(
    db: Database, seeded: list[Seeded], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past CANDIDATES_MAX, a filter is no way in: the page is read walking the order."""
    f = JobFilters(tags=("team:x/y-1.2",), sweep_id=SWEEP)  # 7 of a's jobs; 9 trials
    scope = Scope("a", everyone=False)
    for most, way_in in ((6, None), (7, "job_tags"), (9, "job_tags"), (10**6, "job_tags")):
        monkeypatch.setattr(search_module, "CANDIDATES_MAX", most)
        with db.reader() as s:
            found = search_module._narrowest(s, scope, f)
        which = None if found is None else "job_tags" if "job_tags" in str(found[0]) else "jobs"
        assert which == way_in, most

"""The order a free worker tries waiting entries in (worker.fair_share_order.fair_order)."""

from __future__ import annotations

import datetime as dt

from core.queue import job_id_of
from worker.fair_share_order import Shares, Waiting, fair_order

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def waiting(entry: str, owner: str | None, age: int, priority: int = 0) -> Waiting:
    """`age`: seconds after T0 it was made (smaller is older)."""
    return Waiting(entry, owner, priority, T0 + dt.timedelta(seconds=age))


def shares(
    running: dict[str | None, int] | None = None,
    limits: dict[str | None, int | None] | None = None,
    turns: dict[str | None, int] | None = None,
) -> Shares:
    held = {o: frozenset(f"{o}-{i}" for i in range(n)) for o, n in (running or {}).items()}
    return Shares(held, limits or {}, turns or {})


def entries(order: list[Waiting]) -> list[str]:
    return [w.entry for w in order]


def test_the_owner_with_fewer_running_goes_first_whatever_the_age() -> None:
    jobs = [waiting("a1", "a", 0), waiting("a2", "a", 1), waiting("b1", "b", 5)]
    assert entries(fair_order(jobs, shares({"a": 1}))) == ["b1", "a1", "a2"]


def test_a_tie_goes_to_the_owner_whose_turn_came_longest_ago_then_the_oldest_job() -> None:
    jobs = [waiting("a2", "a", 1), waiting("b1", "b", 5), waiting("c1", "c", 3)]
    assert entries(fair_order(jobs, shares())) == ["a2", "c1", "b1"]
    assert entries(fair_order(jobs, shares(turns={"a": 7, "c": 6}))) == ["b1", "c1", "a2"]


def test_an_owners_own_jobs_go_by_priority_then_age() -> None:
    jobs = [
        waiting("low", "a", 0, priority=-1),
        waiting("normal-new", "a", 3),
        waiting("normal-old", "a", 2),
        waiting("high", "a", 4, priority=1),
    ]
    assert entries(fair_order(jobs, shares())) == ["high", "normal-old", "normal-new", "low"]


def test_an_owner_at_its_limit_waits_and_no_limit_means_none() -> None:
    jobs = [waiting("a1", "a", 0), waiting("b1", "b", 1), waiting("x1", None, 2)]
    limited = shares({"a": 2, "b": 1, None: 9}, limits={"a": 2, "b": 3, None: None})
    assert entries(fair_order(jobs, limited)) == ["b1", "x1"]


def test_admin_jobs_are_one_more_owner() -> None:
    jobs = [waiting("a1", "a", 0), waiting("x1", None, 1), waiting("x2", None, 2)]
    assert entries(fair_order(jobs, shares({"a": 1}))) == ["x1", "x2", "a1"]


def test_an_entry_names_its_job_only_by_the_contracts_shapes() -> None:
    job = "0b7c6c58-0d57-4c4e-9e0e-4a2b1f2c3d4e"
    assert job_id_of(job.encode()) == job
    assert job_id_of(f"{job}-a2".encode()) == job
    assert job_id_of(f"{job}x".encode()) is None
    assert job_id_of(b"\xff\xfe") is None
    assert job_id_of(b"not-a-job") is None

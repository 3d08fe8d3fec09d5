"""The outbox: an event is written in the transaction of the status change it tells of, once
per change (a repeated or raced move writes none), to the owner's subscribed endpoints alone
(one marked failing too, held); a transaction rolled back leaves no event. On SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import select

from core.config import Settings
from core.db import Database, WebhookDelivery, WebhookEvent, db_ago
from core.spec import JobSpec, JobStatus
from core.store import claim_job, create_job, end_job, request_cancel, requeue_job
from core.store.sweeps import SweepStatus, end_sweep
from core.sweeps.spec import SweepSpec
from core.sweeps.trials import create as create_sweep
from core.webhooks.deliveries import mark_failing
from core.webhooks.endpoints import create_endpoint, update_endpoint
from core.webhooks.outbox import record_event


def endpoint(db: Database, owner: str, events: list[str]) -> str:
    with db.writer() as s:
        return create_endpoint(
            s, owner=owner, url="https://hooks.example/x", events=events, description=None
        ).id


def job(db: Database, owner: str) -> str:
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec(), owner=owner)
    return job_id


def events_to(db: Database, endpoint_id: str) -> list[dict]:
    with db.reader() as s:
        rows = s.execute(
            select(WebhookEvent.body)
            .join(WebhookDelivery, WebhookDelivery.event_id == WebhookEvent.id)
            .where(WebhookDelivery.endpoint_id == endpoint_id)
            .order_by(WebhookDelivery.id)
        )
        return [json.loads(body) for (body,) in rows]


@pytest.fixture
def owner() -> str:
    return f"k_{uuid.uuid4().hex[:12]}"


def test_a_job_that_ends_twice_tells_of_it_once(db: Database, owner: str) -> None:
    hook = endpoint(db, owner, ["job.failed", "job.succeeded"])
    job_id = job(db, owner)
    with db.writer() as s:
        assert claim_job(s, job_id=job_id, worker="w", device="cpu") is not None
    for _ in range(2):  # the second move finds it ended: its guarded UPDATE changes nothing
        with db.writer() as s:
            end_job(s, job_id=job_id, status=JobStatus.failed, code="internal", message="boom")
    [event] = events_to(db, hook)
    assert event["type"] == "job.failed"
    assert event["data"]["job_id"] == job_id
    assert event["data"]["error"] == {"code": "internal", "message": "boom"}
    assert event["data"]["attempt"] == 1


def test_a_move_that_ends_nothing_writes_no_event(db: Database, owner: str) -> None:
    hook = endpoint(db, owner, ["job.failed", "job.canceled", "job.succeeded"])
    job_id = job(db, owner)
    with db.writer() as s:
        claim_job(s, job_id=job_id, worker="w", device="cpu")
    with db.writer() as s:  # running -> queued: no end, no event
        assert requeue_job(s, job_id=job_id, attempt=1, queue_entry="e2", silent_since=db_ago(-60))
    assert events_to(db, hook) == []
    with db.writer() as s:
        assert request_cancel(s, job_id=job_id) == JobStatus.canceled
    assert [e["type"] for e in events_to(db, hook)] == ["job.canceled"]


def test_a_rolled_back_end_leaves_no_event(db: Database, owner: str) -> None:
    hook = endpoint(db, owner, ["job.canceled"])
    job_id = job(db, owner)
    with pytest.raises(RuntimeError), db.writer() as s:
        request_cancel(s, job_id=job_id)
        raise RuntimeError("the transaction fails after the move")
    assert events_to(db, hook) == []
    with db.reader() as s:
        assert s.scalars(select(WebhookEvent).where(WebhookEvent.owner == owner)).all() == []


def test_only_the_owners_subscribed_enabled_endpoints_hear(db: Database, owner: str) -> None:
    wants = endpoint(db, owner, ["job.canceled"])
    other_type = endpoint(db, owner, ["job.succeeded"])
    disabled = endpoint(db, owner, ["job.canceled"])
    with db.writer() as s:
        from core.webhooks.endpoints import get_endpoint

        found = get_endpoint(s, endpoint_id=disabled)
        assert found is not None
        update_endpoint(s, found, {"enabled": False})
    someone_else = endpoint(db, f"{owner}-other", ["job.canceled"])
    job_id = job(db, owner)
    with db.writer() as s:
        request_cancel(s, job_id=job_id)
    assert [e["data"]["job_id"] for e in events_to(db, wants)] == [job_id]
    assert events_to(db, other_type) == events_to(db, disabled) == events_to(db, someone_else) == []


def test_an_endpoint_marked_failing_still_gets_its_events_held(db: Database, owner: str) -> None:
    """Failing (its receiver gave no answer for a day, or 410 Gone) is not the key's choice,
    as disabled is: its events are written, held until it is enabled again."""
    hook = endpoint(db, owner, ["job.canceled"])
    with db.writer() as s:
        assert mark_failing(s, endpoint_id=hook, why="no delivery succeeded for a day")
    job_id = job(db, owner)
    with db.writer() as s:
        request_cancel(s, job_id=job_id)
    assert [e["data"]["job_id"] for e in events_to(db, hook)] == [job_id]


def test_one_event_goes_to_every_endpoint_with_one_id(db: Database, owner: str) -> None:
    first, second = endpoint(db, owner, ["job.canceled"]), endpoint(db, owner, ["job.canceled"])
    with db.writer() as s:
        request_cancel(s, job_id=job(db, owner))
    with db.reader() as s:
        rows = s.scalars(
            select(WebhookDelivery).where(WebhookDelivery.endpoint_id.in_([first, second]))
        ).all()
    assert len(rows) == 2 and rows[0].event_id == rows[1].event_id


def test_a_sweep_that_ends_twice_tells_of_it_once(db: Database, owner: str) -> None:
    hook = endpoint(db, owner, ["sweep.ended"])
    spec = SweepSpec.model_validate(
        {"base": {}, "space": {"lr": {"log_uniform": [1e-4, 1e-2]}}, "trials": 1, "parallel": 1}
    )
    with db.writer() as s:
        sweep, _ = create_sweep(
            s, Settings(), spec=spec, owner=owner, quota_owner=None, idempotency_key=None
        )
    for _ in range(2):
        with db.writer() as s:
            end_sweep(s, sweep_id=sweep.id, status=SweepStatus.canceled)
    [event] = events_to(db, hook)
    assert event["type"] == "sweep.ended"
    assert (event["data"]["sweep_id"], event["data"]["status"]) == (sweep.id, "canceled")


def test_an_owner_without_endpoints_gets_no_rows(db: Database, owner: str) -> None:
    with db.writer() as s:
        assert record_event(s, owner=owner, type="job.failed", data={}) is None
        assert record_event(s, owner=None, type="job.failed", data={}) is None
    with db.reader() as s:
        assert s.scalars(select(WebhookEvent).where(WebhookEvent.owner == owner)).all() == []

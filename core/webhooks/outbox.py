"""The outbox: an event is written in the same transaction as the change it tells of, with
one delivery row for each endpoint of the owner's that asked for its type, so it commits (and
is delivered) exactly when the change does, and never without it. The dispatcher
(core.webhooks.dispatcher) delivers from these rows. See docs/api.md ("Webhooks")."""

from __future__ import annotations

import json
import uuid
from enum import StrEnum
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from core.db import Job, Sweep, WebhookDelivery, WebhookEndpoint, WebhookEvent, as_utc, utcnow
from core.spec import JobStatus


class EventType(StrEnum):
    job_succeeded = "job.succeeded"
    job_failed = "job.failed"
    job_canceled = "job.canceled"
    job_pruned = "job.pruned"
    sweep_ended = "sweep.ended"
    model_alias_moved = "model.alias_moved"


TEST_EVENT = "webhook.test"  # POST /webhooks/{id}/test's: to that endpoint alone
JOB_ENDS = {
    JobStatus.succeeded: EventType.job_succeeded,
    JobStatus.failed: EventType.job_failed,
    JobStatus.canceled: EventType.job_canceled,
    JobStatus.pruned: EventType.job_pruned,
}


def record_event(
    s: Session,
    *,
    owner: str | None,
    type: EventType | str,  # an EventType, or TEST_EVENT
    data: dict[str, Any],
    endpoint_id: str | None = None,
) -> str | None:
    """Write an event of `owner`'s into the outbox, in the caller's transaction (`s`, not
    committed here): it is delivered if and only if that transaction commits, at least once
    to each of the owner's enabled endpoints that subscribe to `type` (all with the same
    `webhook-id`, the id returned), or only to `endpoint_id` when given. An endpoint marked
    failing gets it too, held until it is enabled again; one its key disabled does not.
    Call it only after the change it tells of has been made, in that same transaction: after
    a guarded update that changed a row, so that a repeated or raced move records nothing
    twice. `data` must be JSON; it is sent as the body's `data`, beside `type` and
    `timestamp`. Returns None, and writes nothing, when no endpoint wants the event (an
    owner-less change, none subscribed)."""
    if owner is None:
        return None
    wanted = select(WebhookEndpoint.id, WebhookEndpoint.events).where(
        WebhookEndpoint.owner == owner, WebhookEndpoint.enabled.is_(True)
    )
    if endpoint_id is not None:
        wanted = wanted.where(WebhookEndpoint.id == endpoint_id)
    kind = TEST_EVENT if type == TEST_EVENT else EventType(type).value
    targets = [
        eid for eid, events in s.execute(wanted) if endpoint_id is not None or kind in events
    ]
    if not targets:
        return None
    event_id = new_event_id()
    body = {"type": kind, "timestamp": utcnow().isoformat(), "data": data}
    s.execute(
        insert(WebhookEvent).values(
            id=event_id, owner=owner, type=kind, body=json.dumps(body, separators=(",", ":"))
        )
    )
    s.execute(insert(WebhookDelivery), [{"event_id": event_id, "endpoint_id": e} for e in targets])
    return event_id


def new_event_id() -> str:
    return f"evt_{uuid.uuid4().hex}"


def record_job_end(s: Session, *, job_id: str, status: JobStatus) -> None:
    """The event of a job's end (core.store.lifecycle.move calls it once its guarded UPDATE
    moved the job to `status`, in the same transaction)."""
    job = s.execute(
        select(
            Job.owner, Job.sweep_id, Job.trial_number, Job.attempt, Job.error_code,
            Job.error_message, Job.result, Job.finished_at,
        ).where(Job.id == job_id)
    ).one_or_none()  # fmt: skip
    if job is None or job.owner is None:
        return
    data = {
        "job_id": job_id,
        "status": status.value,
        "attempt": job.attempt,
        "finished_at": _iso(job.finished_at),
        "sweep_id": job.sweep_id,
        "trial_number": job.trial_number,
        "result": job.result if status is JobStatus.succeeded else None,
        "error": None
        if job.error_code is None
        else {"code": job.error_code, "message": job.error_message or ""},
        "links": {"job": f"/jobs/{job_id}"},
    }
    record_event(s, owner=job.owner, type=JOB_ENDS[status], data=data)


def record_sweep_end(s: Session, *, sweep_id: str) -> None:
    """The event of a sweep's end (core.store.sweeps.end_sweep calls it once its guarded
    UPDATE ended the sweep, in the same transaction)."""
    sweep = s.execute(
        select(Sweep.owner, Sweep.status, Sweep.trials_created, Sweep.finished_at).where(
            Sweep.id == sweep_id
        )
    ).one_or_none()
    if sweep is None:
        return
    data = {
        "sweep_id": sweep_id,
        "status": sweep.status,
        "trials": sweep.trials_created,
        "finished_at": _iso(sweep.finished_at),
        "links": {"sweep": f"/sweeps/{sweep_id}"},
    }
    record_event(s, owner=sweep.owner, type=EventType.sweep_ended, data=data)


def _iso(t: Any) -> str | None:
    return None if t is None else str(as_utc(t).isoformat())  # type: ignore[union-attr]

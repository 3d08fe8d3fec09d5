"""A job's life as data: every move of its status, declared once in TRANSITIONS (from ->
to -> guard), and `move`, the one guarded UPDATE that makes each of them. See docs/jobs.md."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Update, delete, insert, or_, select, update
from sqlalchemy.orm import Session

from core.db import AttemptTime, Checkpoint, DbTime, Job, db_now
from core.spec import JobStatus
from core.webhooks.outbox import record_job_end

queued, running = JobStatus.queued, JobStatus.running


class Guard(StrEnum):
    """What a move's UPDATE checks besides the row's status, in its own WHERE."""

    entry = "entry"  # the row names the queue entry a worker took (claim)
    attempt = "attempt"  # the attempt the caller speaks for still owns the job
    silent = "silent"  # the attempt has not beaten since `silent_since` (a lost one)


class IllegalMove(ValueError):
    """A status change TRANSITIONS does not declare, or one without a guard it needs."""


def _claimed() -> dict[str, Any]:
    return {"attempt": Job.attempt + 1, "started_at": db_now(), "heartbeat_at": db_now()}


def _handed_back() -> dict[str, Any]:
    return {"worker": None, "enqueued_at": db_now()}


def _ended() -> dict[str, Any]:
    return {"finished_at": db_now()}


@dataclass(frozen=True)
class Transition:
    """Into `to` from any of `sources`, with `guards` the caller may add (`needs`: must)."""

    sources: frozenset[JobStatus]
    to: JobStatus
    guards: frozenset[Guard]
    needs: frozenset[Guard]
    values: Callable[[], dict[str, Any]]  # what every such move writes besides the status
    who: str  # its callers, for the docs

    @property
    def ends(self) -> bool:
        """A job at the end of its life: its checkpoint goes with the move."""
        return self.to.terminal


def _t(
    sources: Collection[JobStatus],
    to: JobStatus,
    guards: Collection[Guard],
    needs: Collection[Guard],
    values: Callable[[], dict[str, Any]],
    who: str,
) -> tuple[JobStatus, Transition]:
    return to, Transition(frozenset(sources), to, frozenset(guards), frozenset(needs), values, who)


ATTEMPT, SILENT = Guard.attempt, Guard.silent
# One transition into each status: its sources, the guards it may or must carry, its callers.
TRANSITIONS: Mapping[JobStatus, Transition] = dict(
    [
        _t([queued], running, [Guard.entry], [], _claimed, "claim_job (worker.attempt.claim)"),
        _t(
            [running], queued, [ATTEMPT, SILENT], [ATTEMPT], _handed_back,
            "requeue_job (worker.reconciler), retry_job and preempt_job (worker.execution)",
        ),
        _t([running], JobStatus.succeeded, [ATTEMPT], [], _ended, "succeed_job (worker)"),
        _t([running], JobStatus.pruned, [ATTEMPT], [ATTEMPT], _ended, "end_job (worker.recorder)"),
        _t(
            [queued, running], JobStatus.failed, [ATTEMPT, SILENT], [], _ended,
            "end_job (worker.attempt.fail, worker.admission, worker.reconciler)",
        ),
        _t(
            [queued, running], JobStatus.canceled, [ATTEMPT, SILENT], [], _ended,
            "request_cancel (API, sweeps), end_job (worker.attempt.fail, worker.reconciler)",
        ),
    ]
)  # fmt: skip


def transition(to: JobStatus, sources: Collection[JobStatus] | None) -> Transition:
    """The declared move into `to` from `sources` (None: all it declares), or IllegalMove."""
    t = TRANSITIONS.get(to)
    if t is None or (sources is not None and not set(sources) <= t.sources):
        raise IllegalMove(f"no declared move from {sorted(sources or [])} to {to}")
    return t


def move(
    s: Session,
    job_id: str,
    to: JobStatus,
    *,
    sources: Collection[JobStatus] | None = None,
    attempt: int | None = None,
    entry: str | None = None,
    silent_since: DbTime | None = None,
    **values: Any,
) -> bool:
    """The one write of jobs.status: the declared move into `to`, its guards in the UPDATE's
    WHERE (a compare-and-set: only one of any racing callers wins). True if it moved; the
    attempt's time then starts (a claim) or ends (a move off running or to an end), and an
    ended job's checkpoint goes and its webhook event is written (core.webhooks.outbox), in
    the same transaction."""
    t = transition(to, sources)
    given = {Guard.attempt: attempt, Guard.entry: entry, Guard.silent: silent_since}
    _check_guards(t, {g for g, v in given.items() if v is not None})
    q = update(Job).where(Job.id == job_id, Job.status.in_(sorted(sources or t.sources)))
    if attempt is not None:
        q = q.where(Job.attempt == attempt)
    if silent_since is not None:
        q = q.where(Job.heartbeat_at < silent_since)
    if entry is not None:
        q = q.where(entry_named(job_id, entry))
    if not updated(s, q.values(status=to, **(t.values() | values))):
        return False
    if to == running:
        start_attempt_time(s, job_id=job_id)
        return True
    if t.ends:
        s.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id))
        record_job_end(s, job_id=job_id, status=to)  # the outbox: only when this move won
    end_attempt_time(s, job_id=job_id)
    return True


def _check_guards(t: Transition, given: set[Guard]) -> None:
    if not given <= t.guards or not t.needs <= given:
        raise IllegalMove(
            f"a move to {t.to} takes guards {sorted(t.guards)} and needs {sorted(t.needs)}, "
            f"not {sorted(given)}"
        )


def entry_named(job_id: str, entry: str) -> Any:
    """The claim's guard: the row names the entry a worker runs (every enqueue records its
    entry first), so an entry made up in Redis claims nothing. A row of an older trainq
    with no entry recorded accepts only the job's own id."""
    named = Job.queue_entry == entry
    return or_(named, Job.queue_entry.is_(None)) if entry == job_id else named


def requeued(queue_entry: str, preempted: bool) -> dict[str, Any]:
    """What a running job handed back to the queue writes besides `move`'s own values: its
    new entry, and `preempted` counts it as a preemption, not a restart."""
    return {"queue_entry": queue_entry, "preemptions": Job.preemptions + int(preempted)}


def restarts_used(job: Job) -> int:
    """The attempts after the first that were restarts, not preemptions."""
    return max(job.attempt - 1 - job.preemptions, 0)


def updated(s: Session, statement: Update) -> bool:
    """Run a guarded UPDATE; True if its guard held (it changed the row)."""
    res = s.execute(statement)
    return bool(res.rowcount)  # type: ignore[attr-defined]


def running_attempt(job_id: str, attempt: int) -> Update:
    """An UPDATE of the job row (not of its status) that holds only while `attempt` still
    runs the job: a heartbeat, a stop request, an attempt's fenced write."""
    return update(Job).where(Job.id == job_id, Job.attempt == attempt, Job.status == running)


def start_attempt_time(s: Session, *, job_id: str) -> None:
    """The time of the attempt just claimed starts counting against its owner's training
    hours, from the claim's started_at."""
    claimed = select(Job.owner, Job.id, Job.attempt, Job.started_at).where(Job.id == job_id)
    s.execute(
        insert(AttemptTime).from_select(["owner", "job_id", "attempt", "started_at"], claimed)
    )


def end_attempt_time(s: Session, *, job_id: str) -> None:
    """The job's running attempt stops counting (`move` calls this with every move off
    running); nothing to do for a job that was not running."""
    s.execute(
        update(AttemptTime)
        .where(AttemptTime.job_id == job_id, AttemptTime.ended_at.is_(None))
        .values(ended_at=db_now())
    )

"""The model of one job's life: what its attempts write, what the API and the reconciler do
to it, and what the database and the stream must then hold. The rules that drive it are in
machine.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from hypothesis.stateful import (
    RuleBasedStateMachine,
)
from sqlalchemy.orm import Session

from core.errors import JobSuperseded
from core.queue import enqueue_job
from core.spec import ExportFormat, JobSpec, JobStatus
from core.store import (
    create_job,
    end_job,
    heartbeat,
    preempt_job,
    save_epoch,
    save_steps,
    succeed_job,
)
from core.stream import (
    Outcome,
    cancel_key,
    publish_epoch,
    publish_status,
    publish_steps,
)
from core.train import StepMetrics
from core.train.metrics import ExportedModel
from tests.job_life.attempt import (
    EPOCHS,
    STEPS_PER_EPOCH,
    TOTAL_STEPS,
    Attempt,
    epoch_end,
    epoch_of,
    point,
)
from tests.job_life.world import World

MAX_RESTARTS = 2
MAXLEN = 1000  # far above what one job writes here: nothing is trimmed


class JobModel(RuleBasedStateMachine):
    world: ClassVar[World]  # set by the test, on a subclass of its own

    def __init__(self) -> None:
        super().__init__()
        self.w = world = self.world
        self.job_id = str(uuid.uuid4())
        self.spec = JobSpec(epochs=EPOCHS, max_restarts=MAX_RESTARTS)
        with world.db.writer() as s:
            create_job(s, job_id=self.job_id, spec=self.spec, owner="life")
        self.enqueue(self.job_id)
        # The model: what the database and the stream must hold.
        self.status = JobStatus.queued
        self.attempts: list[Attempt] = []
        self.latest: Attempt | None = None
        self.preemptions = 0
        self.cancel_requested = False
        self.stream_ended = False
        self.stored: dict[int, int] = {}  # step -> attempt, in the database
        self.streamed: dict[int, int] = {}  # step -> attempt, in the stream
        self.followed = False  # /metrics and SSE were read once the job ended

    # -- the model's view of who may write -------------------------------------------------

    def owns_db(self, a: Attempt) -> bool:
        return self.latest is a and self.status is JobStatus.running

    def owns_stream(self, a: Attempt) -> bool:
        """The stream's fence is the attempt that last started; nothing lands after an end."""
        return self.latest is a and not self.stream_ended

    def db_write(self, a: Attempt, write: Callable[[Session], object]) -> bool:
        """A fenced database write of attempt `a`; whether it landed (as the model says)."""
        try:
            with self.w.db.writer() as s:
                write(s)
            landed = True
        except JobSuperseded:
            landed = False
        assert landed == self.owns_db(a), f"attempt {a.number}'s write: landed={landed}"
        return landed

    def expect_stream(self, a: Attempt, outcome: Outcome) -> bool:
        landed = outcome is Outcome.WRITTEN
        assert landed == self.owns_stream(a), f"attempt {a.number}'s stream write: {outcome}"
        return landed

    # -- what an attempt writes, and what the model expects of it ----------------------------

    def make_progress(self, a: Attempt, size: int) -> None:
        """What the trainer does next: stop on a cancel, end its epoch, or make a block of
        steps (streamed, then a heartbeat)."""
        if a.done:
            return
        if self.w.r.exists(cancel_key(self.job_id)):
            self.finish(a, succeed=False)
        elif a.epoch_due:
            self.end_epoch(a)
        elif a.last_step < TOTAL_STEPS:
            self.write_block(a, size)

    def write_block(self, a: Attempt, size: int) -> None:
        last = min(a.next + size - 1, epoch_of(a.next) * STEPS_PER_EPOCH)
        block = [point(step, a.number) for step in range(a.next, last + 1)]
        outcome = publish_steps(self.w.r, self.job_id, block, MAXLEN, attempt=a.number)
        if self.expect_stream(a, outcome):
            self.streamed.update({p.step: a.number for p in block})
        a.unsaved += block
        a.last_block = block
        a.next = last + 1
        self.db_write(a, lambda s: heartbeat(s, job_id=self.job_id, attempt=a.number))

    def end_epoch(self, a: Attempt) -> None:
        """The epoch's steps, metrics and checkpoint in one transaction, then its event."""
        m = epoch_end(a.last_step, a.number)
        steps = list(a.unsaved)
        blob = f"checkpoint {a.number}@{m.step}".encode()

        def store(s: Session) -> None:
            save_epoch(
                s, job_id=self.job_id, attempt=a.number, epoch=m, steps=steps, checkpoint=blob
            )

        if self.db_write(a, store):
            self.replace_stored(steps)
        a.unsaved, a.saved_to = [], m.step
        self.expect_stream(a, publish_epoch(self.w.r, self.job_id, m, attempt=a.number))

    def replace_stored(self, steps: list[StepMetrics]) -> None:
        """The store replaces what is stored from the first step written on."""
        if steps:
            self.stored = {k: v for k, v in self.stored.items() if k < steps[0].step}
            self.stored.update({p.step: int(p.loss) for p in steps})

    def resend(self, a: Attempt) -> None:
        if a.last_block:
            outcome = publish_steps(self.w.r, self.job_id, a.last_block, MAXLEN, attempt=a.number)
            self.expect_stream(a, outcome)  # written before: nothing changes

    def finish(self, a: Attempt, succeed: bool) -> None:
        """The run returns: it succeeds once trained to the end, else it fails (canceled
        when a cancel was asked for), keeping the steps it made."""
        a.done = True
        if self.w.r.exists(cancel_key(self.job_id)):
            self.fail(a, JobStatus.canceled, "canceled")
        elif succeed and a.trained:
            self.succeed(a)
        else:
            self.fail(a, JobStatus.failed, "diverged")

    def succeed(self, a: Attempt) -> None:
        with self.w.db.writer() as s:
            moved = succeed_job(
                s,
                job_id=self.job_id,
                attempt=a.number,
                result={"ok": 1},
                record={},
                models=[ExportedModel(ExportFormat.torchscript, b"model", "0" * 64)],
            )
        assert moved == self.owns_db(a)
        if moved:
            self.status = JobStatus.succeeded
        self.publish_end(a, TOTAL_STEPS, {"status": self.status, "result": {"ok": 1}})

    def fail(self, a: Attempt, status: JobStatus, code: str) -> None:
        steps = list(a.unsaved)
        if steps and self.db_write(
            a, lambda s: save_steps(s, job_id=self.job_id, attempt=a.number, steps=steps)
        ):
            self.replace_stored(steps)
        could_move = self.latest is a and not self.status.terminal
        with self.w.db.writer() as s:
            moved = end_job(
                s, job_id=self.job_id, status=status, code=code, message=code, attempt=a.number
            )
        # The current attempt of a running job always ends it; a superseded one never
        # does. (The current attempt of a requeued job may or may not: either is safe.)
        assert moved <= could_move and (moved or not self.owns_db(a))
        if moved:
            self.status = status
        self.publish_end(a, a.last_step, {"status": self.status, "error": {"code": code}})

    def publish_end(self, a: Attempt, step: int, payload: dict[str, Any]) -> None:
        """As the worker does: the job's end, once the database says it ended."""
        if self.status.terminal:
            outcome = publish_status(self.w.r, self.job_id, step, payload, attempt=a.number)
            self.stream_ended |= self.expect_stream(a, outcome)

    def preempt(self, a: Attempt) -> None:
        """The job goes back to the queue mid-epoch, with a checkpoint at the last step the
        attempt made and its steps since its last epoch end."""
        a.done = True
        entry = f"{self.job_id}-p{a.number}"
        with self.w.db.writer() as s:
            moved = preempt_job(
                s,
                job_id=self.job_id,
                attempt=a.number,
                epoch=epoch_of(max(a.last_step, 1)),
                step=a.last_step,
                steps=a.unsaved,
                checkpoint=b"mid-epoch",
                queue_entry=entry,
            )
        assert moved == self.owns_db(a)
        if moved:
            self.replace_stored(a.unsaved)
            self.status = JobStatus.queued
            self.preemptions += 1
            self.enqueue(entry)

    def enqueue(self, entry: str) -> None:
        enqueue_job(
            self.w.r,
            queue=self.w.queue,
            job_id=self.job_id,
            spec=self.spec.model_dump(mode="json"),
            owner="life",
            timeout_s=3600,
            queue_entry=entry,
        )

    def cancel(self) -> None:
        """POST /jobs/{id}/cancel: a queued job ends at once, a running one is asked to stop;
        an ended one answers 409."""
        resp = self.w.http.post(f"/jobs/{self.job_id}/cancel")
        if self.status.terminal:
            assert resp.status_code == 409, resp.text
            return
        assert resp.status_code == 202, resp.text
        if self.status is JobStatus.queued:
            self.status = JobStatus.canceled
            self.stream_ended = True  # the API writes the end
        else:
            self.cancel_requested = True

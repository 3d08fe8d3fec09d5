"""The life of one job as a hypothesis state machine: the rules are what workers, the
reconciler and the API do to it, the invariants what the database, the stream and the API
must then show (tests/integration/test_job_life.py runs it)."""

from __future__ import annotations

import time

from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
)

from core.spec import JobStatus
from core.store import (
    claim_job,
    end_job,
    get_job,
    latest_checkpoint,
    set_total_steps,
    step_rows,
)
from core.stream import (
    END,
    EntryId,
    publish_status,
    read,
)
from tests.job_life.attempt import (
    STEPS_PER_EPOCH,
    TOTAL_STEPS,
    Attempt,
)
from tests.job_life.model import MAX_RESTARTS, JobModel
from tests.job_life.world import assert_every_key_expires, followed_events, metrics_pages
from worker.reconciler import reconcile_once

SILENT_S = 0.001  # the heartbeat timeout of a pass that finds the attempt silent


class JobLife(JobModel):
    # -- a worker's side --------------------------------------------------------------------

    @initialize()
    def first_claim(self) -> None:
        """Every example starts with a worker on the job (a cancel before any claim is the
        plain case that tests/integration/test_jobs_http.py covers)."""
        self.claim()

    @precondition(lambda self: self.status is JobStatus.queued)
    @rule()
    def claim(self) -> None:
        """A worker gets the queue entry and claims the job: a new attempt, resumed from the
        last checkpoint (a requeued job's)."""
        number = self.latest.number + 1 if self.latest else 1
        with self.w.db.writer() as s:
            job = claim_job(s, job_id=self.job_id, worker=f"w{number}", device="cpu")
            assert job is not None and job.attempt == number
            checkpoint = latest_checkpoint(s, job_id=self.job_id)
        a = Attempt(number, checkpoint.step if checkpoint else 0)
        self.attempts.append(a)
        self.latest, self.status = a, JobStatus.running
        self.db_write(
            a,
            lambda s: set_total_steps(
                s, job_id=self.job_id, attempt=a.number, total_steps=TOTAL_STEPS
            ),
        )
        payload = {"status": "running", "attempt": number, "resumed_from_step": a.start}
        self.expect_stream(
            a, publish_status(self.w.r, self.job_id, a.start, payload, attempt=a.number)
        )
        # The start drops what earlier attempts streamed past the checkpoint.
        self.streamed = {k: v for k, v in self.streamed.items() if k <= a.start}

    @precondition(lambda self: self.status is not JobStatus.queued)
    @rule()
    def duplicate_delivery(self) -> None:
        """The same queue entry delivered again (or a stale one): it must not run."""
        with self.w.db.writer() as s:
            assert claim_job(s, job_id=self.job_id, worker="w-dup", device="cpu") is None

    def live(self) -> bool:
        return self.latest is not None and not self.latest.silent and not self.latest.done

    @precondition(live)
    @rule(size=st.integers(1, STEPS_PER_EPOCH))
    def train(self, size: int) -> None:
        """The current attempt's next block of steps (or its epoch end, when due)."""
        assert self.latest is not None
        self.make_progress(self.latest, size)

    @precondition(live)
    @rule()
    def train_to_epoch_end(self) -> None:
        """Two moves of the current attempt at once (the rest of an epoch, then its end)."""
        assert self.latest is not None
        self.make_progress(self.latest, STEPS_PER_EPOCH)
        self.make_progress(self.latest, STEPS_PER_EPOCH)

    @precondition(lambda self: self.live() and self.latest.trained)
    @rule()
    def run_succeeds(self) -> None:
        assert self.latest is not None
        self.finish(self.latest, succeed=True)

    @precondition(live)
    @rule(mishap=st.sampled_from(["lost reply", "worker dies", "run fails", "preempted"]))
    def mishap(self, mishap: str) -> None:
        """Redis ran the last block but its reply was lost (the block is sent again); the
        worker dies or hangs (it may come back later); the run fails; or the worker is
        stopping (SIGTERM) and hands the job back."""
        a = self.latest
        assert a is not None
        if mishap == "lost reply":
            self.resend(a)
        elif mishap == "worker dies":
            a.silent = True
        elif mishap == "run fails":
            self.finish(a, succeed=False)
        else:
            self.preempt(a)

    def zombies(self) -> list[Attempt]:
        return [a for a in self.attempts if a.silent and not a.done]

    @precondition(lambda self: self.zombies())
    @rule(
        pick=st.integers(0, 7),
        act=st.sampled_from(["trains", "resends", "run ends"]),
        size=st.integers(1, STEPS_PER_EPOCH),
    )
    def zombie(self, pick: int, act: str, size: int) -> None:
        """An attempt that died or hung (and may be declared lost, or superseded) comes back
        and writes on: its next block or epoch end, a block sent again, or its end."""
        zombies = self.zombies()
        a = zombies[pick % len(zombies)]
        if act == "trains":
            self.make_progress(a, size)
        elif act == "resends":
            self.resend(a)
        else:
            self.finish(a, succeed=True)

    # -- the reconciler's and the API's side -------------------------------------------------

    @rule(event=st.sampled_from(["reconcile pass", "cancel"]))
    def outside(self, event: str) -> None:
        """A reconcile pass that finds the attempt beating (nothing moves), or a cancel."""
        if event == "cancel":
            self.cancel()
        else:
            reconcile_once(self.w.db, self.w.r, self.w.beating)

    @precondition(lambda self: self.status is JobStatus.running)
    @rule()
    def heartbeat_times_out(self) -> None:
        """The attempt went silent (dead or hung) past the heartbeat timeout: a reconcile
        pass requeues the job, or fails it once its restarts are used up (canceled if a
        cancel was asked for)."""
        assert self.latest is not None
        self.latest.silent = True
        time.sleep(2 * SILENT_S)
        reconcile_once(self.w.db, self.w.r, self.w.silent)
        restarts_used = self.latest.number - 1 - self.preemptions
        if self.cancel_requested:
            self.status = JobStatus.canceled
        elif restarts_used >= MAX_RESTARTS:
            self.status = JobStatus.failed
        else:
            self.status = JobStatus.queued
        self.stream_ended |= self.status.terminal  # the reconciler writes the end

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def database_holds_the_model(self) -> None:
        with self.w.db.writer() as s:
            job = get_job(s, job_id=self.job_id)
            assert job is not None
            status, attempt = JobStatus(job.status), job.attempt
            rows = step_rows(s, job_id=self.job_id, after=0, limit=10_000)
        assert status is self.status, "a status moved as it should not (or reverted)"
        assert attempt == (self.latest.number if self.latest else 0)
        steps = [row["step"] for row in rows]
        assert steps == sorted(set(steps)), "a step stored twice or out of order"
        assert {row["step"]: int(row["loss"]) for row in rows} == self.stored

    @invariant()
    def stream_holds_the_model(self) -> None:
        entries = read(self.w.r, self.job_id, None, 10_000)
        ends = [i for i, (eid, _, _) in enumerate(entries) if EntryId.parse(eid).seq == END]
        assert not ends or ends[0] == len(entries) - 1, f"written after the end: {entries}"
        # Every follower closes: the stream of an ended job holds its end.
        assert self.stream_ended == self.status.terminal
        assert bool(ends) == self.stream_ended, f"{self.status}, ends at {ends}"
        streamed = {
            EntryId.parse(eid).step: int(d["loss"]) for eid, kind, d in entries if kind == "step"
        }
        assert streamed == self.streamed
        # The stored steps and the streamed ones are the same writes, where both hold one.
        assert all(self.streamed[k] == v for k, v in self.stored.items() if k in self.streamed)

    @invariant()
    def an_ended_job_expires_and_reads_whole(self) -> None:
        """Checked when the job ends (and again when the example ends)."""
        if self.status.terminal and not self.followed:
            self.followed = True
            assert_every_key_expires(self.w.r, self.job_id)
            self.read_metrics()
            self.read_events()

    def expected_steps(self) -> list[tuple[int, int]]:
        """Every step from 1 to the last, each as the attempt that owned it wrote it."""
        merged = {**self.streamed, **self.stored}
        return sorted(merged.items())

    def read_metrics(self) -> None:
        got = metrics_pages(self.w.http, self.job_id)
        expected = self.expected_steps()
        assert [step for step, _ in expected] == list(range(1, len(expected) + 1))
        assert got == expected

    def read_events(self) -> None:
        """The whole event stream of the ended job: it closes, and holds every step once."""
        events = followed_events(self.w.http, self.job_id)
        steps = [(d["step"], int(d["loss"])) for k, d in events if k == "step"]
        assert not [d for k, d in events if k == "gap"], "no step is gone here"
        assert steps == self.expected_steps()
        assert events and events[-1][0] == "status" and events[-1][1]["status"] == self.status

    def teardown(self) -> None:
        if self.status.terminal:
            # Also after what happened since the end.
            assert_every_key_expires(self.w.r, self.job_id)
        # An abandoned job ends, so that later examples' reconcile passes skip it.
        with self.w.db.writer() as s:
            end_job(s, job_id=self.job_id, status=JobStatus.canceled, code="abandoned")

"""The life of one job as a state machine (hypothesis): random interleavings of claims,
duplicate deliveries, step blocks, epoch ends, replies lost, workers that die and come back
as zombies, heartbeat timeouts and reconcile passes, preemptions, cancels over HTTP,
resumes from the checkpoint, successes and failures. It drives the real store, stream and
reconciler functions against a real redis-server and a real database, with the API over
real HTTP for cancel, `/metrics` and the event stream.

After every step: a terminal status never reverts; the database and the stream hold what
the attempts that owned the job wrote, each step at most once, and nothing of an attempt
after its successor claimed the job; once the job ended, its stream holds its end (every
follower closes), every key of it in Redis expires, and `/metrics` and SSE give every step
from 1 to the last exactly once, in order.

Runs are derandomized (the same examples on every run, as CI needs) and bounded."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redis import Redis
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import Database
from core.errors import JobSuperseded
from core.local.migrate import upgrade
from core.queue import enqueue_job, entry_is_live
from core.spec import JobSpec, JobStatus
from core.store import (
    claim_job,
    create_job,
    end_job,
    get_job,
    heartbeat,
    latest_checkpoint,
    preempt_job,
    save_epoch,
    save_steps,
    set_total_steps,
    step_rows,
    succeed_job,
)
from core.stream import (
    END,
    Outcome,
    cancel_key,
    publish_epoch,
    publish_status,
    publish_steps,
    read,
    seq_of,
    step_of,
)
from core.train import EpochMetrics, StepMetrics
from tests.service import RedisServer, Service
from worker.reconciler import reconcile_once

pytestmark = pytest.mark.slow  # real workers and services: the full run, not --fast

STEPS_PER_EPOCH = 3
EPOCHS = 2
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS
MAX_RESTARTS = 2
MAXLEN = 1000  # far above what one job writes here: nothing is trimmed
SILENT_S = 0.001  # the heartbeat timeout of a pass that finds the attempt silent
LONG_S = 3600.0  # ... and of one that finds it healthy
SSE_READ_TIMEOUT_S = 15.0  # above the API's idle block, so its database fallback may answer
RUNS = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
)


@dataclass
class World:
    """The real parts one module shares: a database, a redis-server and the API."""

    db: Database
    r: Redis
    http: httpx.Client
    queue: str
    beating: Settings  # a reconcile pass that finds the attempt beating
    silent: Settings  # ... and one that finds it silent past the heartbeat timeout


@pytest.fixture(scope="module")
def world(
    database_url: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    upgrade(database_url)
    data_dir = tmp_path_factory.mktemp("life")
    # The API's own reconciler stays out of the way: the machine runs reconcile passes itself.
    api = Service(
        data_dir=data_dir,
        database_url=database_url,
        redis=redis_server,
        extra_env={"TRAINQ_RECONCILE_INTERVAL_S": "3600", "TRAINQ_HEARTBEAT_TIMEOUT_S": "3600"},
    )
    api.start_api()
    db = Database(database_url)
    r = redis_server.client()
    http = httpx.Client(
        base_url=api.url, headers={"Authorization": f"Bearer {api.admin_key}"}, timeout=10
    )
    try:
        yield World(
            db=db,
            r=r,
            http=http,
            queue=api.queue,
            beating=Settings(data_dir=data_dir, queue=api.queue, heartbeat_timeout_s=LONG_S),
            silent=Settings(
                data_dir=data_dir, queue=api.queue, heartbeat_timeout_s=SILENT_S, queue_grace_s=0
            ),
        )
    finally:
        http.close()
        r.close()
        db.dispose()
        api.stop()


def epoch_of(step: int) -> int:
    return (step - 1) // STEPS_PER_EPOCH + 1


def point(step: int, attempt: int) -> StepMetrics:
    """A step as attempt `attempt` reports it: its loss names the attempt, so every stored
    or streamed step says who wrote it."""
    return StepMetrics(step, epoch_of(step), float(attempt), 1e-3, 100.0, 0, 0, 0, 0.0)


def epoch_end(step: int, attempt: int) -> EpochMetrics:
    return EpochMetrics(epoch_of(step), step, float(attempt), 0.9, 0.4, 0.9, 1.0, 100.0)


@dataclass
class Attempt:
    """One attempt as its worker sees it."""

    number: int
    start: int  # the step it resumed after (its checkpoint's)
    next: int = field(init=False)  # the next step it makes
    saved_to: int = field(init=False)  # the last epoch end it stored (or its start)
    unsaved: list[StepMetrics] = field(default_factory=list)
    last_block: list[StepMetrics] = field(default_factory=list)
    silent: bool = False  # its worker died or hangs (it may come back: a zombie)
    done: bool = False  # its run returned: it writes nothing more

    def __post_init__(self) -> None:
        self.next = self.start + 1
        self.saved_to = self.start

    @property
    def last_step(self) -> int:
        return self.next - 1

    @property
    def epoch_due(self) -> bool:
        return self.last_step > self.saved_to and self.last_step % STEPS_PER_EPOCH == 0

    @property
    def trained(self) -> bool:
        return self.last_step == TOTAL_STEPS and not self.epoch_due


class JobLife(RuleBasedStateMachine):
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
                model=b"model",
                sha256="0" * 64,
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
        ends = [i for i, (eid, _, _) in enumerate(entries) if seq_of(eid) == END]
        assert not ends or ends[0] == len(entries) - 1, f"written after the end: {entries}"
        # Every follower closes: the stream of an ended job holds its end.
        assert self.stream_ended == self.status.terminal
        assert bool(ends) == self.stream_ended, f"{self.status}, ends at {ends}"
        streamed = {step_of(eid): int(d["loss"]) for eid, kind, d in entries if kind == "step"}
        assert streamed == self.streamed
        # The stored steps and the streamed ones are the same writes, where both hold one.
        assert all(self.streamed[k] == v for k, v in self.stored.items() if k in self.streamed)

    @invariant()
    def an_ended_job_expires_and_reads_whole(self) -> None:
        """Checked when the job ends (and again when the example ends)."""
        if self.status.terminal and not self.followed:
            self.followed = True
            self.every_key_expires()
            self.read_metrics()
            self.read_events()

    def every_key_expires(self) -> None:
        for key in self.w.r.scan_iter(match=f"*{self.job_id}*", count=1000):
            name = key.decode()
            # RQ's hash of an entry still waiting in the queue expires once a worker picks
            # it up (and skips it: the job ended); no worker runs here.
            waiting = name.startswith("rq:job:") and entry_is_live(self.w.r, name[7:])
            assert waiting or self.w.r.ttl(key) > 0, f"{name} never expires"

    def expected_steps(self) -> list[tuple[int, int]]:
        """Every step from 1 to the last, each as the attempt that owned it wrote it."""
        merged = {**self.streamed, **self.stored}
        return sorted(merged.items())

    def read_metrics(self) -> None:
        """/metrics, page by page (pages of 4 cross the database/stream boundary)."""
        got: list[tuple[int, int]] = []
        after = 0
        while True:
            resp = self.w.http.get(f"/jobs/{self.job_id}/metrics?after={after}&limit=4")
            assert resp.status_code == 200, resp.text
            page = resp.json()
            if not page["items"]:
                break
            got += [(p["step"], int(p["loss"])) for p in page["items"]]
            after = page["next"]
        expected = self.expected_steps()
        assert [step for step, _ in expected] == list(range(1, len(expected) + 1))
        assert got == expected

    def read_events(self) -> None:
        """The whole event stream of the ended job: it closes, and holds every step once."""
        events: list[tuple[str, dict[str, Any]]] = []
        kind = ""
        timeout = httpx.Timeout(10, read=SSE_READ_TIMEOUT_S)
        with self.w.http.stream("GET", f"/jobs/{self.job_id}/events", timeout=timeout) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    events.append((kind, json.loads(line.removeprefix("data: "))))
        steps = [(d["step"], int(d["loss"])) for k, d in events if k == "step"]
        assert not [d for k, d in events if k == "gap"], "no step is gone here"
        assert steps == self.expected_steps()
        assert events and events[-1][0] == "status" and events[-1][1]["status"] == self.status

    def teardown(self) -> None:
        if self.status.terminal:
            self.every_key_expires()  # also after what happened since the end
        # An abandoned job ends, so that later examples' reconcile passes skip it.
        with self.w.db.writer() as s:
            end_job(s, job_id=self.job_id, status=JobStatus.canceled, code="abandoned")


def test_job_life(world: World) -> None:
    machine = type("JobLifeHere", (JobLife,), {"world": world})
    run_state_machine_as_test(machine, settings=RUNS)

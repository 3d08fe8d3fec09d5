"""The trainer's callbacks for one attempt: its progress recorded in Redis and the database.
See docs/jobs.md."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy.orm import Session

from core.errors import JobSuperseded, TrialPruned
from core.spec import JobSpec, JobStatus
from core.store import end_job, save_epoch, save_steps, set_total_steps
from core.store.sweeps import set_trial_attrs
from core.stream import Publisher, epoch_entry, status_entry, step_entries
from core.sweeps.search import Verdict
from core.sweeps.trials import judge_epoch
from core.train import Callbacks, EpochMetrics, StepMetrics
from core.train.loop import RunInfo
from core.worker_stats import publish_worker_stats
from worker.attempt import Attempt
from worker.heartbeat import Heartbeat

CANCEL_POLL_S = 0.25


class Recorder:
    """Trainer callbacks -> Redis (every block of steps, one round trip) and the DB (once per
    epoch: that epoch's steps, its metrics and its checkpoint in one transaction); every
    callback tells the heartbeat (worker.heartbeat) that the trainer is moving, and
    `should_stop` answers with a cancel from either.

    Redis is best effort here: while it is away, points wait in memory and go out when it
    is back; the database keeps the full history either way."""

    def __init__(self, a: Attempt, spec: JobSpec, trial: tuple[str, int] | None = None) -> None:
        self.attempt = a
        self.spec = spec
        self.batch_size = spec.batch_size
        self.trial = trial  # (sweep id, trial number): its sweep's pruner judges each epoch
        self.total_steps: int | None = None
        self.stream = Publisher(a.r, a.job_id, a.number, a.settings.metrics_maxlen, row=a.row)
        self.heart = Heartbeat(
            a.db,
            job_id=a.job_id,
            attempt=a.number,
            every_s=min(5.0, a.settings.heartbeat_timeout_s / 3),
            stall_timeout_s=a.settings.stall_timeout_s,
            stop_asked=a.stop_asked,  # into the job row at once, between steps or not
        )
        self.unsaved: list[StepMetrics] = []  # the steps since the last stored epoch
        self.last_step = 0
        self.pending_epoch: EpochMetrics | None = None
        self.next_cancel_check = 0.0

    def callbacks(self) -> Callbacks:
        return Callbacks(
            on_start=self.on_start,
            on_steps=self.on_steps,
            on_epoch=self.on_epoch,
            on_checkpoint=self.on_checkpoint,
            should_stop=self.should_stop,
            on_progress=self.heart.touch,
            should_preempt=self.attempt.stop_asked,
        )

    def status(self, step: int, payload: dict[str, Any]) -> None:
        self.stream.add([status_entry(step, payload)])
        self.stream.flush(force=JobStatus(payload["status"]).terminal)  # the end: try anyway

    def on_start(self, info: RunInfo) -> None:
        a = self.attempt
        self.total_steps = info.total_steps
        a.write(
            lambda s: set_total_steps(
                s, job_id=a.job_id, attempt=a.number, total_steps=info.total_steps
            )
        )

    def on_steps(self, points: Sequence[StepMetrics]) -> None:
        self.heart.touch()
        if self.heart.superseded:
            raise JobSuperseded(
                f"attempt {self.attempt.number} of job {self.attempt.job_id} no longer owns it"
            )
        self.unsaved.extend(points)
        self.stream.add(step_entries(points))
        self.last_step = points[-1].step
        if self.stream.flush():
            self._publish_stats(points[-1])

    def _publish_stats(self, last: StepMetrics) -> None:
        """What the worker's GPU does now, for the fleet's view (core.worker_stats)."""
        try:
            publish_worker_stats(
                self.attempt.r,
                self.attempt.worker,
                {
                    "job_id": self.attempt.job_id,
                    "images_per_second": last.images_per_second,
                    "step_seconds": self.batch_size / max(last.images_per_second, 1e-9),
                    "memory_allocated": last.memory_allocated,
                    "memory_reserved": last.memory_reserved,
                    "memory_peak": last.memory_peak,
                },
            )
        except RedisError as e:
            self.stream.failed(e)

    def on_epoch(self, m: EpochMetrics) -> None:
        self.pending_epoch = m  # stored with its checkpoint, which comes next

    def on_checkpoint(self, epoch: int, blob: bytes) -> None:
        m, a = self.pending_epoch, self.attempt
        if m is None or m.epoch != epoch:
            raise RuntimeError("checkpoint without its epoch metrics")
        steps = [p for p in self.unsaved if p.step <= m.step]
        judged = self._judge(m)

        def store(s: Session) -> str | None:
            save_epoch(s, job_id=a.job_id, attempt=a.number, epoch=m, steps=steps, checkpoint=blob)
            return self._verdict(s, m, judged) if judged is not None else None

        pruned = a.write(store)
        self.unsaved = [p for p in self.unsaved if p.step > m.step]
        self.heart.touch()
        self.stream.add([epoch_entry(m)])  # after the epoch's steps, however long they wait
        self.stream.flush()
        if pruned is not None:
            raise TrialPruned(pruned)

    def _judge(self, m: EpochMetrics) -> tuple[Verdict, str] | None:
        """A trial's pruner on this epoch, from a read of its sweep (no lock held)."""
        if self.trial is None:
            return None
        sweep_id, number = self.trial
        with self.attempt.db.reader() as s:
            return judge_epoch(s, sweep_id=sweep_id, number=number, epoch=m.epoch, metrics=m)

    def _verdict(self, s: Session, m: EpochMetrics, judged: tuple[Verdict, str]) -> str | None:
        """In the epoch's own transaction: what the pruner keeps on the trial, and a pruned
        trial's end, stored with the epoch that judged it, or none of them (a crash before
        the commit trains the epoch again and asks again). The last epoch is judged too, so
        that its value competes at its rung, but never pruned: the run ends there, with its
        model."""
        verdict, why = judged
        a = self.attempt
        set_trial_attrs(s, job_id=a.job_id, attrs=verdict.attrs)
        last = m.epoch >= self.spec.epochs or (
            self.total_steps is not None and m.step >= self.total_steps
        )
        if not verdict.prune or last:
            return None
        end_job(
            s,
            job_id=a.job_id,
            status=JobStatus.pruned,
            code="pruned",
            message=why,
            from_statuses=(JobStatus.running,),
            attempt=a.number,
        )
        return why

    def flush_history(self) -> None:
        """A run that stops mid-epoch keeps the steps it made."""
        a, steps = self.attempt, self.unsaved
        try:
            a.write(lambda s: save_steps(s, job_id=a.job_id, attempt=a.number, steps=steps))
        except JobSuperseded:
            return
        self.unsaved = []
        self.stream.flush(force=True)  # before the end; if Redis is away, the database has them

    def handed_back(self) -> None:
        """The steps went back with the job (core.store.preempt_job): none left to store;
        those Redis missed go out."""
        self.unsaved = []
        self.flush_history()

    def should_stop(self) -> bool:
        if self.heart.cancel_requested:
            return True
        now = time.monotonic()
        if now < self.next_cancel_check:
            return False
        self.next_cancel_check = now + CANCEL_POLL_S
        return self.stream.cancel_requested()

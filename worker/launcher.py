"""`trainq worker --gpus all|0,1|cpu`: one RQ worker process per GPU, each with
CUDA_VISIBLE_DEVICES set to its GPU and named after host and GPU. The launcher never touches
CUDA (it counts GPUs with nvidia-smi), restarts a worker that dies with back-off, and adopts
the work horses of dead workers (a child subreaper), starting no replacement while one still
runs: two jobs would share one GPU. See docs/operations.md ("Running the service")."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from core.lifetime import ends_with_this_process
from core.versions import running_versions

RESTART_FIRST_S = 1.0  # after a worker's failure, doubled each time it fails again
RESTART_MAX_S = 60.0
STABLE_S = 60.0  # a worker that ran this long before failing starts its back-off afresh
ORPHAN_GRACE_S = 30.0  # an adopted horse's time to checkpoint after SIGTERM, then SIGKILL
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


@dataclass
class Slot:
    gpu: str | None  # None: the CPU
    name: str
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0  # in a row
    restart_at: float | None = None  # set once its exit is seen


@dataclass
class Orphans:
    """Processes reparented to the launcher: work horses (and their DataLoader workers)
    whose worker died. Each got SIGTERM from its parent's death (worker.rq_worker sets it), so
    that its job checkpoints and goes back on the queue; one still running after
    ORPHAN_GRACE_S gets SIGKILL (the reconciler requeues its job as lost)."""

    seen: dict[int, float] = field(default_factory=dict)

    def running(self, slots: list[Slot]) -> bool:
        """Reaps those that ended; whether any still runs."""
        ours = {s.proc.pid for s in slots if s.proc}
        now = time.monotonic()
        alive = {}
        for pid in child_pids(os.getpid()):
            if pid in ours or _reaped(pid):
                continue
            alive[pid] = self.seen.get(pid, now)
            if now - alive[pid] > ORPHAN_GRACE_S:
                print(
                    f"trainq worker: adopted process {pid} outlived its grace; killed",
                    file=sys.stderr,
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.seen = alive
        return bool(alive)


def child_pids(parent: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it has just ended
        if int(fields[1]) == parent:
            out.append(int(stat.parent.name))
    return out


def _reaped(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # not ours to wait for (any more)
    return done == pid


def adopt_orphans() -> bool:
    """Makes the launcher the child subreaper of its tree, on Linux."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def visible_gpus() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False, timeout=30)
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def parse_gpus(value: str) -> list[str | None]:
    """'all' -> every GPU (or the CPU if there is none); 'cpu'; or '0,1'."""
    if value == "cpu":
        return [None]
    if value == "all":
        gpus = visible_gpus()
        return list(gpus) if gpus else [None]
    ids = [v.strip() for v in value.split(",") if v.strip()]
    if not ids or not all(v.isdigit() for v in ids):
        raise ValueError(f"--gpus takes 'all', 'cpu' or GPU indices like '0,1', not {value!r}")
    return list(ids)


def slots_for(gpus: list[str | None]) -> list[Slot]:
    host = socket.gethostname()
    return [Slot(gpu=g, name=f"{host}-{'cpu' if g is None else 'gpu' + g}") for g in gpus]


def spawn(slot: Slot, queue: str, redis_url: str, burst: bool) -> None:
    env = dict(os.environ)
    # A CPU worker sees no GPU at all, so it never initialises CUDA by accident.
    env["CUDA_VISIBLE_DEVICES"] = "" if slot.gpu is None else slot.gpu
    # By environment: a URL may hold a password, and any user of the host reads command lines.
    env["TRAINQ_REDIS_URL"] = redis_url
    cmd = [sys.executable, "-m", "worker.rq_worker", "--name", slot.name, "--queue", queue]
    cmd += ["--burst"] if burst else []
    # A worker whose launcher is gone would go on taking jobs beside its successor's.
    slot.proc = subprocess.Popen(cmd, env=env, preexec_fn=ends_with_this_process())
    slot.started, slot.restart_at = time.monotonic(), None


def restart_delay(slot: Slot, returncode: int) -> float:
    """A clean exit (0) is restarted at once and never counted; a failure waits 1 s,
    doubling for each failure in a row up to a minute."""
    if returncode == 0:
        return 0.0
    if time.monotonic() - slot.started >= STABLE_S:
        slot.failures = 0
    slot.failures += 1
    return min(RESTART_FIRST_S * 2.0 ** (slot.failures - 1), RESTART_MAX_S)


def run_workers(
    gpus: str,
    queue: str,
    redis_url: str,
    *,
    burst: bool = False,
    reconcile: Callable[[], None] | None = None,
    reconcile_every_s: float = 10.0,
    schema_problem: Callable[[], str | None] | None = None,
) -> int:
    """Start the workers and supervise them: a worker that dies is restarted with back-off
    (restart_delay), once no horse of a dead worker runs, and only while `schema_problem`
    finds nothing wrong with the database (the check `trainq worker` makes as it starts: a
    database migrated past this trainq, say); SIGINT/SIGTERM are passed on (RQ: finish or
    stop the job, then exit). Beside them the launcher runs `reconcile` (requeue lost
    jobs) every `reconcile_every_s`, on a thread of its own: a pass slow on Redis or the
    database never holds up the restarts, nor the exit once the workers have stopped
    (docker stop's grace is 10 s)."""
    slots = slots_for(parse_gpus(gpus))
    orphans = Orphans() if adopt_orphans() else None
    stopping = threading.Event()  # and no reconcile pass starts from then on

    told: dict[int, int] = {}  # pid: the stop signal sent, once (RQ: a second one kills the job)

    def forward(signum: int, _frame: FrameType | None) -> None:
        stopping.set()
        for s in slots:
            if s.proc and s.proc.poll() is None and s.proc.pid not in told:
                told[s.proc.pid] = signum
                s.proc.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    _start_all(slots, queue, redis_url, burst)
    if reconcile is not None:
        _every(reconcile, reconcile_every_s, stopping)
    while True:
        alive = [s for s in slots if s.proc and s.proc.poll() is None]
        if not alive and (stopping.is_set() or burst):
            stopping.set()
            return max(abs(int(s.proc.returncode or 0)) for s in slots if s.proc)
        if stopping.is_set():
            _tell_late_starters(alive, told)
        adopted = orphans is not None and orphans.running(slots)
        if not stopping.is_set() and not burst:
            for s in slots:
                _restart_if_exited(s, queue, redis_url, held_back=adopted, check=schema_problem)
        time.sleep(0.5)


def _tell_late_starters(alive: list[Slot], told: dict[int, int]) -> None:
    """A worker started as the stop signal came (it was handled mid-spawn) gets it too."""
    signum = next(iter(told.values()), signal.SIGTERM)
    for s in alive:
        if s.proc and s.proc.pid not in told:
            told[s.proc.pid] = signum
            s.proc.send_signal(signum)


def _start_all(slots: list[Slot], queue: str, redis_url: str, burst: bool) -> None:
    own = running_versions()
    for s in slots:
        spawn(s, queue, redis_url, burst)
        print(
            f"trainq worker {s.name} (gpu {s.gpu or 'none: cpu'}; trainq {own.trainq}, "
            f"JobSpec {own.spec}, schema {own.schema})",
            file=sys.stderr,
        )


def _every(step: Callable[[], None], every_s: float, until: threading.Event) -> None:
    """`step` now and then every `every_s` after the last ended, on a daemon thread (the
    process's exit does not wait for it), until `until` is set."""

    def loop() -> None:
        while not until.is_set():
            try:
                step()
            except Exception as e:  # the next pass tries again: the thread must not end
                with contextlib.suppress(Exception):  # nor end on a full or closed stderr
                    print(f"trainq worker: reconcile pass failed: {e!r}", file=sys.stderr)
            until.wait(every_s)

    threading.Thread(target=loop, name="trainq-reconcile", daemon=True).start()


def _restart_if_exited(
    slot: Slot,
    queue: str,
    redis_url: str,
    *,
    held_back: bool,
    check: Callable[[], str | None] | None = None,
) -> None:
    """A worker that exited starts again after its back-off (restart_delay); `held_back`
    while a horse of a dead worker still runs, which would share its GPU. A `check` that
    finds a problem (or fails) holds the restart back too, as a failure of the worker's:
    said once each time, then tried again after the next back-off."""
    if slot.proc is None or slot.proc.poll() is None:
        return
    if slot.restart_at is None:
        delay = restart_delay(slot, slot.proc.returncode)
        slot.restart_at = time.monotonic() + delay
        print(
            f"trainq worker {slot.name} exited ({slot.proc.returncode}); "
            f"restarting in {delay:.0f} s",
            file=sys.stderr,
        )
    if time.monotonic() < slot.restart_at or held_back:
        return
    problem = _problem(check) if check is not None else None
    if problem is not None:
        delay = restart_delay(slot, 1)
        slot.restart_at = time.monotonic() + delay
        print(
            f"trainq worker {slot.name}: not restarted: {problem}; checking again in {delay:.0f} s",
            file=sys.stderr,
        )
        return
    spawn(slot, queue, redis_url, burst=False)


def _problem(check: Callable[[], str | None]) -> str | None:
    try:
        return check()
    except Exception as e:  # the database away: no worker could start on it either
        return f"cannot read the database's schema revision ({type(e).__name__}: {e})"

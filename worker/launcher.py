"""`trainq worker --gpus all|0,1|cpu`: one RQ worker process per GPU, each with
CUDA_VISIBLE_DEVICES set to its GPU and named after host and GPU. The launcher never
imports torch or touches CUDA: it counts GPUs with nvidia-smi."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType


@dataclass
class Slot:
    gpu: str | None  # None: the CPU
    name: str
    proc: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)


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
    cmd = [sys.executable, "-m", "worker.run", "--name", slot.name, "--queue", queue]
    cmd += ["--burst"] if burst else []
    slot.proc = subprocess.Popen(cmd, env=env)


def run_workers(
    gpus: str,
    queue: str,
    redis_url: str,
    *,
    burst: bool = False,
    reconcile: Callable[[], None] | None = None,
    reconcile_every_s: float = 10.0,
) -> int:
    """Start the workers and supervise them: a worker that dies is restarted (at most 5
    times a minute); SIGINT/SIGTERM are passed on (RQ: finish or stop the job, then exit).
    Between checks the launcher runs `reconcile` (requeue lost jobs) every few seconds."""
    slots = slots_for(parse_gpus(gpus))
    next_reconcile = time.monotonic()
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for s in slots:
            if s.proc and s.proc.poll() is None:
                s.proc.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    for s in slots:
        spawn(s, queue, redis_url, burst)
        print(f"trainq worker {s.name} (gpu {s.gpu or 'none: cpu'})", file=sys.stderr)
    while True:
        alive = [s for s in slots if s.proc and s.proc.poll() is None]
        if not alive and (stopping or burst):
            return max(abs(s.proc.returncode or 0) for s in slots if s.proc)
        for s in slots:
            if s.proc and s.proc.poll() is not None and not stopping and not burst:
                now = time.monotonic()
                s.restarts = [t for t in s.restarts if now - t < 60] + [now]
                if len(s.restarts) > 5:
                    print(f"trainq worker {s.name} keeps dying; giving up", file=sys.stderr)
                    forward(signal.SIGTERM, None)
                    continue
                print(
                    f"trainq worker {s.name} exited ({s.proc.returncode}); restarting",
                    file=sys.stderr,
                )
                spawn(s, queue, redis_url, burst)
        if reconcile is not None and time.monotonic() >= next_reconcile and not stopping:
            reconcile()
            next_reconcile = time.monotonic() + reconcile_every_s
        time.sleep(0.5)

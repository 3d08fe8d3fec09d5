"""`trainq up`'s processes: the API, the worker launcher and, unless TRAINQ_REDIS_URL names
another, the embedded redis-server, each a child in a process group of its own, stopped in
order on SIGTERM, SIGINT or SIGHUP (the API and the launcher first, Redis last, as the jobs
handed back are written there). See docs/operations.md ("Stopping and starting")."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

from core.lifetime import ends_with_this_process

STOP_GRACE_S = 30.0  # a child's time to stop after SIGTERM (a job's hand-back), then SIGKILL
POLL_S = 0.2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    may_end: bool = False  # its end alone does not stop the others (a burst launcher's)

    def running(self) -> bool:
        return self.proc.poll() is None


def start(
    name: str, command: Sequence[str], env: dict[str, str], *, may_end: bool = False
) -> Child:
    """A child in a process group of its own: a ^C at the terminal reaches `up` alone, which
    stops the children in order. It gets SIGTERM if `up` dies."""
    proc = subprocess.Popen(
        list(command), env=env, start_new_session=True, preexec_fn=ends_with_this_process()
    )
    return Child(name, proc, may_end)


class Supervisor:
    """Runs until asked to stop or until a child ends that may not, then stops every child:
    those of `first` together, then those of `last`."""

    def __init__(self, grace_s: float = STOP_GRACE_S) -> None:
        self.grace_s = grace_s
        self.first: list[Child] = []
        self.last: list[Child] = []
        self.asked: int | None = None

    def handle_signals(self) -> None:
        def ask(signum: int, _frame: FrameType | None) -> None:
            self.asked = signum

        for signum in STOP_SIGNALS:
            signal.signal(signum, ask)

    def wait(self) -> int:
        """Until a stop signal (0) or a child's unexpected end (its exit code, or 1)."""
        while self.asked is None:
            for child in self.first + self.last:
                code = child.proc.poll()
                if code is not None and not child.may_end:
                    print(f"trainq up: the {child.name} ended ({code}); stopping", file=sys.stderr)
                    return code or 1
            time.sleep(POLL_S)
        print(f"trainq up: {signal.Signals(self.asked).name}; stopping", file=sys.stderr)
        return 0

    def stop(self) -> None:
        for group in (self.first, self.last):
            stop_together(group, self.grace_s)


def stop_together(children: list[Child], grace_s: float) -> None:
    """SIGTERM to each child still running, and to that child itself (a launcher passes it
    on to its workers once: a second one would be RQ's cold shutdown, which kills the horse
    mid hand-back). A child that has already ended (a killed launcher) gets none: what it
    left in its group (its workers) got SIGTERM from its death (core.lifetime), and is
    handing its jobs back. Then the wait, up to `grace_s`, until each child's whole process
    group is gone, not the child alone; SIGKILL to any group still there after it. So the
    next groups (Redis) are stopped only once what this one left has handed its jobs back."""
    for child in children:
        if child.running():
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.proc.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            print(f"trainq up: the {child.name} outlived its grace; killed", file=sys.stderr)
        while group_alive(child.proc.pid) and time.monotonic() < deadline:
            time.sleep(POLL_S / 4)
        if group_alive(child.proc.pid):
            print(
                f"trainq up: the {child.name}'s processes outlived its grace; killed",
                file=sys.stderr,
            )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGKILL)  # what it left in its group, if anything
        child.proc.wait()


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` runs. Those of it that are this process's own
    children and have ended are reaped first (a leader, or, where `up` is a container's
    pid 1, the orphans it adopted), as a zombie counts as a member until then."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-pgid, os.WNOHANG)[0] != 0:
            pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

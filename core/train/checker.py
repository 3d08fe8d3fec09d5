"""The process that checks a trained model's formats (core.train.verify_export), and how a
trainer asks it.

A checker imports torch and the formats' loaders once, then forks a child for each check:
every check runs in a process that shares nothing with training, as a user's download
would, without paying Python's and torch's start-up each time. A worker starts one checker
as it starts (`share`) and its work horses, forked from it, inherit the way to ask it; a
process with none (a `trainq train` on a laptop) starts one for its export alone, before
the exports, so that its imports overlap them. Each format is asked about as soon as it is
exported: its check runs while the next format exports.

The way to ask is a pair of Unix sockets made with the checker: no name on any disk, no
port, nothing another user of the host can reach. Each check sends the checker one end of
a new connection and writes what to check on the other. A checker dies with the process
that started it."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.errors import ExportCheckUnavailable
from core.train import verify_export

VERIFIER = Path(__file__).with_name("verify_export.py")
MAX_ANSWER = 1 << 20  # a report is a few hundred bytes


@dataclass
class Pending:
    """One format's check, asked and not yet answered."""

    fmt: str
    conn: socket.socket
    asked: float = field(default_factory=time.perf_counter)
    answer: bytearray = field(default_factory=bytearray)
    seconds: float | None = None  # asked -> answered, once it is


class Checker:
    def __init__(self, proc: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.proc = proc
        self.control = control

    @classmethod
    def start(cls) -> Checker:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    str(VERIFIER),
                    f"--parent={os.getpid()}",
                    f"--serve={theirs.fileno()}",
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        return cls(proc, mine)

    def running(self) -> bool:
        """Whether it has not exited: only the process that started it can tell."""
        return self.proc.poll() is None

    def ask(
        self,
        fmt: str,
        blob: bytes,
        x: torch.Tensor,
        expected: torch.Tensor,
        meta: dict[str, str] | None,
        timeout_s: float,
        arrays: tuple[bytes, bytes] | None = None,
    ) -> Pending:
        """Send one format to be checked; OSError if the checker is gone. What to check is
        written by a thread of its own, as the check reads it: the next format exports
        meanwhile, and a checker that never reads holds up no one but `answers`."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self.control, [b"check"], [theirs.fileno()])
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        if arrays is None:
            arrays = (verify_export.as_bytes(x), verify_export.as_bytes(expected))
        parts = verify_export.encode_parts(list(x.shape), arrays, {fmt: blob}, meta, timeout_s)
        threading.Thread(target=_send, args=(mine, parts), daemon=True).start()
        return Pending(fmt, mine)

    def kill(self) -> None:
        """What a check past its time does to the checker: a worker starts it again."""
        with contextlib.suppress(OSError):
            os.kill(self.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        """Our end of its socket closed, and the checker ended (its checks with it)."""
        self.control.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _send(conn: socket.socket, parts: list[bytes]) -> None:
    with contextlib.suppress(OSError):  # the check died, or `answers` gave up on it
        for part in parts:
            conn.sendall(part)
        conn.shutdown(socket.SHUT_WR)


def answers(
    pending: list[Pending], timeout_s: float, progress: Callable[[], None] = lambda: None
) -> dict[str, dict[str, Any]]:
    """Each pending check's report (per format: max_abs_diff or error, and check_s), waited
    for at most `timeout_s`; `progress` is called every few seconds meanwhile (the worker's
    heartbeat sees a live attempt). A check that cannot answer (killed, out of time,
    unreadable) is ExportCheckUnavailable: not the model's fault, and the job is retried
    rather than failed as a mismatch."""
    deadline = time.monotonic() + timeout_s
    waiting = {p.conn: p for p in pending}
    try:
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ExportCheckUnavailable(
                    f"the fresh process checking the model's formats did not finish in "
                    f"{timeout_s:.0f} s"
                )
            ready, _, _ = select.select(list(waiting), [], [], min(5.0, left))
            if not ready:
                progress()
            for conn in ready:
                _read(waiting, conn)
    finally:
        for p in pending:
            p.conn.close()
    return {p.fmt: _report(p) for p in pending}


def _read(waiting: dict[socket.socket, Pending], conn: socket.socket) -> None:
    p = waiting[conn]
    try:
        chunk = conn.recv(65536)
    except OSError as e:
        raise ExportCheckUnavailable(f"the process checking {p.fmt} failed: {e}") from e
    if chunk and len(p.answer) + len(chunk) <= MAX_ANSWER:
        p.answer += chunk
        return
    p.seconds = time.perf_counter() - p.asked
    del waiting[conn]


def _report(p: Pending) -> dict[str, Any]:
    if not p.answer:
        raise ExportCheckUnavailable(f"the fresh process checking {p.fmt} answered nothing")
    try:
        report: dict[str, dict[str, Any]] = json.loads(p.answer)
        entry = report[p.fmt]
    except (ValueError, KeyError, TypeError) as e:
        raise ExportCheckUnavailable(
            f"the fresh process checking {p.fmt} answered no report ({e})"
        ) from e
    entry["waited_s"] = round(p.seconds or 0.0, 3)
    return entry


_shared: Checker | None = None


def share() -> Checker:
    """The checker this process and the work horses it forks will ask: started now, or
    again if it exited. Called by a worker before it forks each horse."""
    global _shared
    if _shared is None or not _shared.running():
        if _shared is not None:
            _shared.close()
        _shared = Checker.start()
    return _shared


def shared() -> Checker | None:
    """The checker a worker shared before this process was forked, if any."""
    return _shared

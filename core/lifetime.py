"""A child process that must not outlive its parent: the API, the worker launcher and the
embedded Redis under `trainq up`, and each worker under its launcher. A worker whose launcher
is gone would go on taking jobs beside the launcher's successor.

Linux only (prctl's PR_SET_PDEATHSIG); elsewhere a child outlives its parent as before.
See docs/operations.md ("Stopping and starting")."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ParentGone(Exception):
    """The parent died before the child could ask to be told of it."""


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl


def end_with_parent(parent: int, signum: int = signal.SIGTERM) -> None:
    """This process gets `signum` when its parent (`parent`, the pid it was started by)
    dies. The parent may have died before this call: then no signal would ever come, so it
    raises ParentGone instead."""
    prctl = _prctl()
    if prctl is None:
        return
    if prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        raise ParentGone(f"parent {parent} is gone")


def ends_with_this_process(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` for subprocess.Popen: the child (whatever it execs, a redis-server
    too: the setting survives exec) gets `signum` when the calling process dies, and exits at
    once if it died before the child started. It runs between fork and exec, so it does the
    least: libc is loaded here, in the parent."""
    parent = os.getpid()
    prctl = _prctl()

    def preexec() -> None:
        if prctl is None:
            return
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec

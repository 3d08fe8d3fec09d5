"""A worker's processes as the fault tests find them: an RQ worker's children are its work
horse and the checker of the jobs' formats (core.train.checker), which it keeps for all its
horses.

Each is named by what it runs, never by what it is not: a process that is ending (killed,
its memory being freed) reads an empty command line before it is a zombie, and a child
forked but not yet started reads its parent's."""

from __future__ import annotations

import os
from pathlib import Path

from tests.service import alive, children


def _runs(pid: int, what: bytes) -> bool:
    try:
        return what in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def is_checker(pid: int) -> bool:
    return _runs(pid, b"verify_export.py")


def is_rq_worker(pid: int) -> bool:
    """An RQ worker (`python -m worker.rq_worker`), or a horse forked from one."""
    return _runs(pid, b"worker.rq_worker")


def horses(rq_worker: int) -> list[int]:
    """The worker's running work horse, if any: a fork of it (its command line) that leads
    a process group of its own (not the checker, forked and not yet started)."""
    return [p for p in children(rq_worker) if alive(p) and is_rq_worker(p) and _leads(p)]


def rq_workers(launcher: int) -> list[int]:
    """The launcher's running RQ workers: not a checker or a horse of a worker that was
    killed, which the launcher (a subreaper) holds until they end."""
    return [p for p in children(launcher) if alive(p) and is_rq_worker(p) and not _leads(p)]


def _leads(pid: int) -> bool:
    """Whether it leads a process group of its own, as a work horse does (RQ's fork calls
    setpgrp) and its worker does not."""
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return True  # ended meanwhile


def checkers(rq_worker: int) -> list[int]:
    return [p for p in children(rq_worker) if alive(p) and is_checker(p)]


def serving(checker: int) -> bool:
    """Past its imports and warm-up, and waiting for what to check."""
    try:
        return "skb_wait" in Path(f"/proc/{checker}/wchan").read_text()
    except OSError:
        return False

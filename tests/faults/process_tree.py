"""A worker's processes as the fault tests find them: an RQ worker's children are its work
horse and the checker of the jobs' formats (core.train.checker), which it keeps for all its
horses."""

from __future__ import annotations

from pathlib import Path

from tests.service import alive, children


def is_checker(pid: int) -> bool:
    try:
        return b"verify_export.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def horses(rq_worker: int) -> list[int]:
    """The worker's running children other than its checker: its work horse, if any."""
    return [p for p in children(rq_worker) if alive(p) and not is_checker(p)]


def rq_workers(launcher: int) -> list[int]:
    """The launcher's running RQ workers: not a checker whose worker was killed, which the
    launcher (a subreaper) holds until it has ended it."""
    return [p for p in children(launcher) if alive(p) and not is_checker(p)]


def checkers(rq_worker: int) -> list[int]:
    return [p for p in children(rq_worker) if alive(p) and is_checker(p)]


def serving(checker: int) -> bool:
    """Past its imports and warm-up, and waiting for what to check."""
    try:
        return "skb_wait" in Path(f"/proc/{checker}/wchan").read_text()
    except OSError:
        return False

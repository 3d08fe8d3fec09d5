"""`trainq up`'s supervisor (cli.supervisor) over real processes: each stop signal stops
every child, the last group after the first, one that ignores SIGTERM by SIGKILL after its
grace; a child that ends unexpectedly stops the rest; and a child started to end with its
parent does when the parent is killed (core.local.lifetime)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from core.local.lifetime import ParentGone, end_with_parent
from tests.service import REPO, alive, wait_until

SUPERVISED = """
import json, sys
from cli.supervisor import Supervisor, start
stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
s = Supervisor(grace_s=0.5)
s.handle_signals()
s.first.append(start("stubborn", [sys.executable, "-c", stubborn], {}))
s.first.append(start("sleeper", ["sleep", "60"], {}))
s.last.append(start("last", ["sleep", "60"], {}))
print(json.dumps([c.proc.pid for c in s.first + s.last]), flush=True)
try:
    code = s.wait()
finally:
    s.stop()
sys.exit(code)
"""

ENDS_WITH_PARENT = """
import subprocess
from core.local.lifetime import ends_with_this_process
child = subprocess.Popen(["sleep", "60"], preexec_fn=ends_with_this_process())
print(child.pid, flush=True)
child.wait()
"""


@contextlib.contextmanager
def python(code: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A Python process running `code` and the first line it prints; killed afterwards."""
    with subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            yield proc, proc.stdout.readline()
        finally:
            if proc.poll() is None:
                proc.kill()


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: signal.Signals(s).name
)
def test_a_stop_signal_stops_every_child(signum: int) -> None:
    with python(SUPERVISED) as (supervisor, line):
        children = json.loads(line)
        try:
            supervisor.send_signal(signum)
            assert supervisor.wait(timeout=20) == 0
            assert not [pid for pid in children if alive(pid)]
        finally:
            kill_all(children)


def test_a_child_that_ends_stops_the_others() -> None:
    with python(SUPERVISED) as (supervisor, line):
        children = json.loads(line)
        try:
            os.kill(children[1], signal.SIGKILL)
            assert supervisor.wait(timeout=20) != 0
            assert not [pid for pid in children if alive(pid)]
        finally:
            kill_all(children)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_ends_when_its_parent_is_killed() -> None:
    with python(ENDS_WITH_PARENT) as (parent, line):
        child = int(line)
        try:
            parent.kill()
            parent.wait()
            wait_until(lambda: not alive(child), 10, "the child to end with its parent")
        finally:
            kill_all([child])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_parent_gone_before_the_child_asked_is_seen() -> None:
    with pytest.raises(ParentGone):
        end_with_parent(os.getpid())  # not this process's parent: as if it had died

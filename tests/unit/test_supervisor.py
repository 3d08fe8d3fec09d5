"""`trainq up`'s supervisor (cli.supervisor) over real processes: each stop signal stops
every child, the last group after the first, one that ignores SIGTERM by SIGKILL after its
grace; a child that ends unexpectedly stops the rest; and a child started to end with its
parent does when the parent is killed (core.lifetime)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.supervisor import Supervisor, start
from core.lifetime import ParentGone, end_with_parent
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
from core.lifetime import ends_with_this_process
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


LAUNCHER = """
import subprocess, sys
from core.lifetime import ends_with_this_process
# A worker in this process's group: told by this one's death, it hands its job back.
worker = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1], sys.argv[2]],
    stdout=subprocess.PIPE,
    preexec_fn=ends_with_this_process(),
)
assert worker.stdout is not None
print(worker.stdout.readline().decode().strip(), flush=True)  # its pid, once its handler is in
"""

HANDS_BACK = """
import os, signal, sys, time
def hand_back(_signum, _frame):
    time.sleep(0.5)  # writing to Redis
    with open(sys.argv[1], "a") as f:
        f.write("handed back\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, hand_back)
print(os.getpid(), flush=True)
time.sleep(60)
"""

REDIS = """
import signal, sys, time
def stop(_signum, _frame):
    with open(sys.argv[1], "a") as f:
        f.write("redis stopped\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[2], "w").close()
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.slow
def test_what_a_dead_launcher_left_hands_back_before_redis_stops(tmp_path: Path) -> None:
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    s = Supervisor(grace_s=20)
    launcher = start("launcher", [sys.executable, "-c", LAUNCHER, HANDS_BACK, str(log)], env)
    ready = tmp_path / "ready"
    redis = start("redis", [sys.executable, "-c", REDIS, str(log), str(ready)], env)
    s.first.append(launcher)
    s.last.append(redis)
    try:
        launcher.proc.wait(timeout=20)  # the launcher has died; its worker runs on
        wait_until(ready.exists, 20, "the stand-in Redis")
        s.stop()
        assert log.read_text().splitlines() == ["handed back", "redis stopped"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.proc.pid, signal.SIGKILL)
        kill_all([redis.proc.pid])

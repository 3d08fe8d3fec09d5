"""`trainq up` as an operator stops it: SIGTERM (docker stop, systemd, kill) stops its whole
tree, the API, the launcher, its worker and the embedded redis-server, and frees the port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service import REPO, alive, descendants, free_port, kill_group, wait_until


def trainq_env(data_dir: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env.update(TRAINQ_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", **settings)
    return env


@pytest.fixture
def short_data_dir() -> Iterator[Path]:
    """A data folder with a short path: the embedded Redis's socket lives in it, and a unix
    socket's path is limited to about 100 bytes."""
    with tempfile.TemporaryDirectory(prefix="tq-") as folder:
        yield Path(folder)


def start_up(data_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`trainq up` with the embedded Redis (no TRAINQ_REDIS_URL), serving on `port`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli", "up", "--gpus", "cpu"],
            cwd=REPO,
            env=trainq_env(data_dir, TRAINQ_PORT=str(port), TRAINQ_QUEUE="trainq-up-tree"),
            stdout=out,
            stderr=out,
            start_new_session=True,
        )


def serving_with_a_worker(port: int) -> bool:
    try:
        return bool(httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()["workers_alive"])
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def embedded_redis(data_dir: Path) -> int:
    """The embedded redis-server's pid, wherever it runs in the tree (or outside it)."""
    return int((data_dir / "redis" / "redis.pid").read_text())


def command_of(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return "(gone)"


@pytest.mark.slow  # a whole `trainq up`: its worker loads torch
def test_sigterm_to_up_stops_its_whole_tree(short_data_dir: Path, tmp_path: Path) -> None:
    """SIGINT and SIGHUP take the same path (tests/unit/test_supervisor.py)."""
    port = free_port()
    up = start_up(short_data_dir, port, tmp_path / "up.log")
    tree: list[int] = []
    try:
        wait_until(lambda: serving_with_a_worker(port), 120, "`trainq up` to serve with a worker")
        tree = sorted({*descendants(up.pid), embedded_redis(short_data_dir)})
        commands = [command_of(p) for p in tree]
        assert any("redis-server" in c for c in commands), commands
        assert any("worker.rq_worker" in c for c in commands), commands
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)
        wait_until(lambda: not any(alive(p) for p in tree), 30, "the tree to end", 0.1)
        assert port_free(port)
    except BaseException:
        print((tmp_path / "up.log").read_text()[-4000:])
        left = [f"{p} {command_of(p)}" for p in tree if alive(p)]
        print("left running:", left)
        raise
    finally:
        if up.poll() is None:
            kill_group(up)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

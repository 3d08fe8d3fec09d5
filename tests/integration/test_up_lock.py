"""One `trainq up` a data folder: a second one there is refused at once, naming the first;
and the lock dies with its holder, so an `up` after one killed by SIGKILL starts, on an
embedded Redis of its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults.test_up_tree import embedded_redis, start_up
from tests.service import alive, descendants, free_port, kill_group, wait_until


@contextlib.contextmanager
def up_on(data_dir: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`trainq up` on `data_dir`, and its port; its whole tree killed afterwards."""
    port = free_port()
    proc = start_up(data_dir, port, log)
    try:
        yield proc, port
    finally:
        tree = descendants(proc.pid)
        if proc.poll() is None:
            kill_group(proc)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow  # three `trainq up`
def test_one_up_a_data_folder_and_the_lock_dies_with_its_holder(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="tq-") as folder:
        data_dir = Path(folder)  # short: the embedded Redis's socket is in it
        with up_on(data_dir, tmp_path / "first.log") as (first, port):
            wait_until(lambda: answers(port), 120, "the first `trainq up` to serve")
            first_redis = embedded_redis(data_dir)
            with up_on(data_dir, tmp_path / "second.log") as (second, _):
                assert second.wait(timeout=60) == 1
            said = (tmp_path / "second.log").read_text().strip()
            assert said.count("\n") == 0 and f"(pid {first.pid})" in said, said
            assert answers(port)  # the first is untouched

            first.kill()  # no clean-up: the kernel releases the lock
            first.wait()
            with up_on(data_dir, tmp_path / "third.log") as (third, third_port):
                wait_until(lambda: answers(third_port), 120, "the third `trainq up` to serve")
                assert not alive(first_redis)
                redis = embedded_redis(data_dir)
                assert redis != first_redis and redis in descendants(third.pid)

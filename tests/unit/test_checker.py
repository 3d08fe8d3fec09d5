"""The checker of a model's formats (core.train.checker): started once, a process of its own
for every check, and a job's export that goes on when it is gone."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from core.errors import ExportCheckUnavailable
from core.spec import ExportFormat, JobSpec
from core.train import checker as checker_module
from core.train.checker import Checker, answers
from core.train.data import Dataset, load_dataset
from core.train.export import _portable, export_models
from core.train.run import Run
from tests.service import wait_until


@pytest.fixture(scope="module")
def data(data_dir: Path) -> Dataset:
    return load_dataset("mnist-sample", data_dir)


@pytest.fixture(scope="module")
def net(data: Dataset) -> torch.nn.Module:
    spec = JobSpec.model_validate({"dataset": "mnist-sample", "epochs": 1})
    return Run(spec, torch.device("cpu"), None, data, lambda: None, data.normalization).eval_model


@pytest.fixture
def checker() -> Iterator[Checker]:
    c = Checker.start()
    yield c
    c.close()


@pytest.fixture
def shared_checker() -> Iterator[Checker]:
    """The checker a worker shares with its horses, as in worker.rq_worker."""
    before, checker_module._shared = checker_module._shared, None  # the session's, if any
    c = checker_module.share()
    yield c
    checker_module._shared = before
    c.close()


def torchscript_of(net: torch.nn.Module, data: Dataset) -> tuple[bytes, torch.Tensor, torch.Tensor]:
    result = export_models(net, data, [ExportFormat.torchscript])
    x = data.test.images[:16].float().div(255)
    with torch.inference_mode():
        expected = _portable(net, data)(x)
    return result.models[ExportFormat.torchscript].data, x, expected


def test_every_check_runs_in_a_process_of_its_own(
    checker: Checker, net: torch.nn.Module, data: Dataset
) -> None:
    blob, x, expected = torchscript_of(net, data)

    def pid() -> int:
        asked = checker.ask("torchscript", blob, x, expected, None, 120)
        return int(answers([asked], 120)["torchscript"]["pid"])

    pids = [pid() for _ in range(3)]
    assert len(set(pids)) == 3
    assert not {os.getpid(), checker.proc.pid} & set(pids)


@pytest.mark.slow
def test_a_check_that_dies_is_unavailable_and_the_next_is_answered(
    checker: Checker, net: torch.nn.Module, data: Dataset
) -> None:
    blob, x, expected = torchscript_of(net, data)
    mine, theirs = socket.socketpair()
    socket.send_fds(checker.control, [b"check"], [theirs.fileno()])
    theirs.close()
    mine.sendall(b'{"shape": [1, 1, 28, 28], "classes": 10, "formats": {}}\n' + b"\0" * 7)
    mine.shutdown(socket.SHUT_WR)  # the images are cut short: the check's process fails
    with pytest.raises(ExportCheckUnavailable, match="answered nothing"):
        answers([checker_module.Pending("torchscript", mine)], 60)
    good = answers([checker.ask("torchscript", blob, x, expected, None, 120)], 120)
    assert good["torchscript"]["max_abs_diff"] < 1e-4
    assert checker.running()


def test_a_check_past_its_time_is_unavailable(
    checker: Checker, net: torch.nn.Module, data: Dataset
) -> None:
    blob, x, expected = torchscript_of(net, data)
    os.kill(checker.proc.pid, signal.SIGSTOP)  # it takes the connection, and never forks
    try:
        asked = checker.ask("torchscript", blob, x, expected, None, 120)
        with pytest.raises(ExportCheckUnavailable, match="did not finish in 1 s"):
            answers([asked], 1)
    finally:
        os.kill(checker.proc.pid, signal.SIGCONT)


@pytest.mark.slow
def test_an_export_goes_on_when_the_shared_checker_is_gone(
    shared_checker: Checker, net: torch.nn.Module, data: Dataset
) -> None:
    shared_checker.proc.kill()
    shared_checker.proc.wait()
    exports = export_models(net, data, list(ExportFormat))  # a checker of its own
    assert list(exports.models) == list(ExportFormat)
    for entry in exports.report.values():
        assert entry["ok"] is True and entry["check_s"] > 0 and entry["waited_s"] > 0
    assert checker_module.share() is not shared_checker  # the worker starts it again
    assert checker_module.share().running()
    checker_module.share().close()


def test_an_export_asks_the_shared_checker(
    shared_checker: Checker, net: torch.nn.Module, data: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_other() -> Checker:
        raise AssertionError("a checker of its own was started")

    monkeypatch.setattr(Checker, "start", no_other)
    exports = export_models(net, data, list(ExportFormat))
    assert list(exports.models) == list(ExportFormat)
    assert shared_checker.running()


def test_a_shared_checker_past_its_time_is_ended_and_started_again(
    shared_checker: Checker, net: torch.nn.Module, data: Dataset
) -> None:
    os.kill(shared_checker.proc.pid, signal.SIGSTOP)  # stuck: it forks no check
    with pytest.raises(ExportCheckUnavailable, match="did not finish"):
        export_models(net, data, [ExportFormat.torchscript], check_timeout_s=1)
    shared_checker.proc.wait(timeout=10)  # killed, so that the next job's is a new one
    again = checker_module.share()
    assert again is not shared_checker and again.running()
    again.close()


class Endless(torch.nn.Module):
    """A model whose check runs until its time is up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while bool(x.sum() >= 0):
            x = x * 1.0
        return x.flatten(1)[:, :2]


def check_children(checker: Checker) -> list[int]:
    pid = checker.proc.pid
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.slow
def test_a_check_ends_when_its_asker_is_gone(checker: Checker) -> None:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(Endless()), buf)
    x, expected = torch.zeros(2, 1, 2, 2), torch.zeros(2, 2)
    asked = checker.ask("torchscript", buf.getvalue(), x, expected, None, 600)
    wait_until(lambda: check_children(checker), 60, "the check to start")
    time.sleep(1)  # it has read what to check, and runs the model
    asked.conn.close()  # the job that asked is gone: cancelled, or its horse killed
    wait_until(lambda: not check_children(checker), 10, "the check to end with its asker")
    assert checker.running()


WARM = """
import json, os, threading, torch
set_to = []
set_num_threads = torch.set_num_threads
def recorded(n):  # what warm_up may not call: recorded, and done (its pool counted below)
    set_to.append(n)
    set_num_threads(n)
torch.set_num_threads = recorded
assert torch.get_num_threads() == 2, "the probe runs where torch would use two threads"
from core.train import {0}
def tasks():  # this process's native threads, where Linux's /proc counts them
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
before = tasks()
{0}.warm_up()
others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
print(json.dumps({{
    "python_threads": sorted(others),
    "native_threads": [before, tasks()],
    "thread_counts_set": set_to,
}}))
"""


@pytest.fixture(scope="module", params=["export", "verify_export"])
def warmed_up(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What a fresh process holds once the module (export: the worker's; verify_export: the
    checker's) has warmed up: each test below reads one part of it."""
    out = subprocess.run(
        [sys.executable, "-c", WARM.format(request.param)],
        cwd=Path(__file__).parents[2],
        env={**os.environ, "OMP_NUM_THREADS": "2"},  # one thread would start no pool to see
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def test_warming_up_leaves_no_thread_for_the_forks_that_follow(warmed_up: dict[str, Any]) -> None:
    """The worker forks each horse, and the checker each check, after its warm_up: a thread
    left running there (tqdm's monitor, started by torch.fx's interpreter) may hold a lock
    at the fork that the forked process then waits on for good."""
    assert warmed_up["python_threads"] == []


def test_warming_up_runs_no_kernel_that_starts_threads(warmed_up: dict[str, Any]) -> None:
    """Nor a native thread: a kernel run on a real batch starts OpenMP's pool in the worker
    (or the checker), which the forked horse inherits as threads that are not there, and
    its first parallel op then waits for them for good."""
    before, after = warmed_up["native_threads"]
    if before is None:
        pytest.skip("counts threads in /proc")
    assert after == before


def test_warming_up_sets_no_thread_count_for_the_forks_that_follow(
    warmed_up: dict[str, Any],
) -> None:
    """Setting torch's thread count makes its thread pool (caffe2's pthreadpool) in the
    process that warms up; a horse forked from it then remakes that pool as its autograd
    threads start, and two of them at once found no pool and aborted the horse ("Invalid
    thread pool!", SIGABRT): a job lost and retried for nothing."""
    assert warmed_up["thread_counts_set"] == []

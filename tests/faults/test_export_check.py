"""The fresh process that checks a trained model's formats: when it cannot answer (out of
time, killed), the machine is at fault, not the model. The job goes back to the queue as a
restart and resumes from its final checkpoint (only the export runs again), and fails with
the reason once its restarts are used up. A checker never outlives the process that
started it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.process_tree import checkers, horses, serving
from tests.faults.test_attempts import RECOVERY, ended
from tests.service import REPO, Service, alive, children, descendants, fresh_service, wait_until


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    env = {**RECOVERY, "TRAINQ_EXPORT_CHECK_TIMEOUT_S": "0.01"}
    with fresh_service(tmp_path, data_dir, env) as service:
        yield service


def test_a_check_that_cannot_answer_retries_the_job_then_fails_saying_why(svc: Service) -> None:
    svc.start_worker()
    c = svc.client()
    job = c.submit({"epochs": 1, "max_steps": 4, "max_restarts": 1, "export": ["torchscript"]})
    done = ended(c, job["id"], timeout=180)
    assert done["status"] == "failed"
    assert done["error"]["code"] == "export_check_unavailable"
    assert "did not finish" in done["error"]["message"]
    assert done["attempt"] == 2  # retried once, as a restart
    # The second attempt resumed from the final checkpoint: no step trained twice.
    assert [p["step"] for p in c.metrics(job["id"])["items"]] == [1, 2, 3, 4]


PARENT = """
import time
from core.train.checker import Checker
print(Checker.start().proc.pid, flush=True)
time.sleep(600)
"""


def test_a_checker_dies_with_the_process_that_started_it() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    checker = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)  # no `finally` runs: only the kernel can end it
    parent.wait()
    parent.stdout.close()

    def gone() -> bool:
        try:
            os.kill(checker, 0)
        except ProcessLookupError:
            return True
        # A zombie of the init process counts as gone.
        stat = Path(f"/proc/{checker}/stat").read_text()
        return stat.split(")")[-1].split()[0] == "Z"

    wait_until(gone, 30, f"checker {checker} to die with its parent")


def checkers_under(worker: int) -> list[int]:
    """The formats' checkers among all of a worker's processes (core.train.checker)."""
    found = []
    for pid in descendants(worker):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if any(a.startswith(b"--serve=") for a in argv) and alive(pid):
                found.append(pid)
    return found


def test_a_stuck_checker_is_ended_and_the_worker_starts_another_for_the_retry(
    tmp_path: Path, data_dir: Path
) -> None:
    env = {**RECOVERY, "TRAINQ_EXPORT_CHECK_TIMEOUT_S": "20"}
    with fresh_service(tmp_path, data_dir, env) as svc:
        worker = svc.start_worker()
        wait_until(lambda: len(checkers_under(worker.pid)) == 1, 60, "the worker's checker")
        [stuck] = checkers_under(worker.pid)
        os.kill(stuck, signal.SIGSTOP)  # alive, and it forks no check
        c = svc.client()
        spec = {"epochs": 1, "max_steps": 4, "max_restarts": 1, "export": ["torchscript"]}
        done = ended(c, c.submit(spec)["id"], timeout=240)
        assert done["status"] == "succeeded", done.get("error")
        assert done["attempt"] == 2  # the first one's check could not answer
        assert not alive(stuck)
        [again] = checkers_under(worker.pid)
        assert again != stuck
        # The retry asked the worker's new checker, not one of its own.
        assert "starting one for this job" not in svc.logs()


@pytest.fixture
def patient(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    with fresh_service(tmp_path, data_dir, RECOVERY) as service:
        yield service


def test_a_worker_killed_while_its_horse_waits_for_a_check_leaves_the_job_to_succeed(
    patient: Service,
) -> None:
    """max_restarts 0. The worker's checker is stuck (stopped) when the job's TorchScript
    goes to it, then the RQ worker is killed, and its checker with it: the horse, which
    lives on to finish its export, has the format checked by a checker of its own, and the
    job succeeds instead of failing because a checker it was asking died."""
    launcher = patient.start_worker()
    (rq_worker,) = wait_until(lambda: children(launcher.pid) or None, 60, "the RQ worker")
    (checker,) = wait_until(lambda: checkers(rq_worker) or None, 60, "the worker's checker")
    wait_until(lambda: serving(checker), 60, "the checker to wait for checks", 0.1)
    os.kill(checker, signal.SIGSTOP)
    c = patient.client()
    job = c.submit({"epochs": 1, "max_steps": 4, "max_restarts": 0, "export": ["torchscript"]})
    wait_until(lambda: c.job(job["id"])["progress"]["step"] >= 4, 120, "the last step", 0.1)
    time.sleep(5)  # the evaluation, the export, and its check asked of the stopped checker
    assert horses(rq_worker), "the job ended before its check was asked"
    os.kill(rq_worker, signal.SIGKILL)
    done = ended(c, job["id"], timeout=180)
    assert (done["status"], done["attempt"]) == ("succeeded", 1), done["error"]

"""The fresh process that checks a trained model's formats: when it cannot answer (out of
time, killed), the machine is at fault, not the model. The job goes back to the queue as a
restart and resumes from its final checkpoint (only the export runs again), and fails with
the reason once its restarts are used up. A checker never outlives the process that
started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.test_attempts import RECOVERY, ended
from tests.service import REPO, Service, fresh_service, wait_until


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
import sys, time
from core.spec import ExportFormat
from core.train.export import fresh_checker
with fresh_checker([ExportFormat.torchscript]) as checker:
    print(checker.pid, flush=True)
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

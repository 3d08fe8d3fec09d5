"""`trainq sweep`, `sweep watch|list|show|cancel` and `trainq compare` as a user runs them,
each a process of its own against a real service: the small grid of test_sweeps_http (its
first trial leads, the pruner stops the two others at their first epoch) followed to its end,
then read again; the refusals, each naming what was wrong."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from client.http import ApiError
from tests.service import REPO, Service, wait_until

# test_sweeps_http's GRID, as flags: seed 1 draws 3e-3 first.
GRID_FLAGS = (
    "--epochs", "2", "--batch-size", "128", "--min-lr", "0", "--augment", "none",
    "--ema-decay", "null", "--conv3-channels", "0", "--export", "torchscript",
    "--lr", "3e-3,2e-6,1e-6",
    "--sampler", "grid", "--seed", "1",
    "--pruner", "asha", "--min-epochs", "1", "--reduction-factor", "2",
    "--trials", "3", "--parallel", "1",
)  # fmt: skip
HEADER = ["trial", "status", "lr", "test_accuracy", "epochs"]


def cli_env(service: Service) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env.update(TRAINQ_API_URL=service.url, TRAINQ_API_KEY=service.keys[0], PYTHONUNBUFFERED="1")
    return env


def trainq(service: Service, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *argv],
        cwd=REPO,
        env=cli_env(service),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def table_of(stdout: str) -> list[list[str]]:
    """The rows of the trial table printed last, header first."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == HEADER)
    rows = [line.split() for line in lines[start:]]
    return rows[: next(i for i, r in enumerate(rows) if r[0] in ("best:", "no"))]


@pytest.fixture(scope="module")
def swept(service: Service) -> subprocess.CompletedProcess[str]:
    # Seconds where the machine is free; minutes where the one CPU worker is shared.
    return trainq(service, "sweep", *GRID_FLAGS, timeout=600)


@pytest.fixture(scope="module")
def sweep(service: Service, swept: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    headline = next(line for line in swept.stdout.splitlines() if line.startswith("sweep "))
    return service.client().sweep(headline.split()[1])


@pytest.mark.slow
def test_sweep_follows_the_trials_to_the_best(
    swept: subprocess.CompletedProcess[str], sweep: dict[str, Any]
) -> None:
    assert swept.returncode == 0, swept.stderr
    rows = table_of(swept.stdout)
    assert rows[0] == HEADER and len(rows) == 4
    assert [r[1] for r in rows[1:]] == ["succeeded", "pruned", "pruned"]
    assert rows[1][0] == "0*" and rows[1][2] == "0.003"  # the best, marked
    assert [r[4] for r in rows[1:]] == ["2", "1", "1"]
    best = sweep["best"]
    assert f"best: trial 0  test_accuracy {best['value']:.4f}  lr=0.003" in swept.stdout
    assert swept.stdout.rstrip().endswith(f"trainq download {best['job_id']}")
    # Not a terminal: each change a line, the budget's progress among them.
    pruned = re.findall(
        r"^trial [12]  pruned  lr=[12]e-06  test_accuracy=0\.\d{4}  epochs=1$", swept.stderr, re.M
    )
    assert len(pruned) == 2, swept.stderr
    assert "3/3" in swept.stderr and "\x1b[" not in swept.stderr


@pytest.mark.slow
def test_watch_of_an_ended_sweep_prints_its_final_table(
    service: Service, swept: subprocess.CompletedProcess[str], sweep: dict[str, Any]
) -> None:
    watched = trainq(service, "sweep", "watch", sweep["id"])
    assert watched.returncode == 0, watched.stderr
    assert table_of(watched.stdout) == table_of(swept.stdout)
    assert f"trainq download {sweep['best']['job_id']}" in watched.stdout


@pytest.mark.slow
def test_list_show_and_cancel_of_an_ended_sweep(service: Service, sweep: dict[str, Any]) -> None:
    listed = trainq(service, "sweep", "list")
    assert listed.returncode == 0, listed.stderr
    assert any(
        line.split()[:3] == [sweep["id"], "succeeded", "3/3"] for line in listed.stdout.splitlines()
    )
    shown = trainq(service, "sweep", "show", sweep["id"], "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == sweep["id"]
    canceled = trainq(service, "sweep", "cancel", sweep["id"])
    assert canceled.returncode == 1 and "already ended" in canceled.stderr


@pytest.mark.slow
def test_compare_of_two_trials_shows_lr_in_the_diff(
    service: Service, sweep: dict[str, Any]
) -> None:
    first, second = (t["job_id"] for t in sweep["trials"][:2])
    out = trainq(service, "compare", first, second)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    equal = next(i for i, line in enumerate(lines) if "spec fields equal" in line)
    assert [line.split()[0] for line in lines[1:equal]] == ["lr"]  # the only field that differs
    assert lines[1].split() == ["lr", "0.003", f"{sweep['trials'][1]['params']['lr']:.4g}"]
    assert ["status", "succeeded", "pruned"] in [line.split() for line in lines[equal:]]
    assert any(line.split()[0] == "test_accuracy" for line in lines[equal + 1 :] if line)


def test_a_space_outside_jobspec_exits_2_naming_the_field(service: Service) -> None:
    out = trainq(service, "sweep", "--lr", "loguniform:1e-4,20", "--trials", "2")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "space.lr" in out.stderr and "outside JobSpec's lr" in out.stderr


def test_a_bad_form_is_refused_before_any_request(service: Service) -> None:
    before = [s["id"] for s in service.client().sweeps()]
    out = trainq(service, "sweep", "--lr", "foo:1,2")
    assert out.returncode == 2
    assert out.stderr.startswith("trainq sweep: --lr foo:1,2: unknown form 'foo'")
    assert [s["id"] for s in service.client().sweeps()] == before


@contextlib.contextmanager
def sweep_in_flight(service: Service) -> Iterator[subprocess.Popen[str]]:
    """`trainq sweep` of trials long enough to be interrupted; the sweep canceled after. Its
    SIGINT is the default one even where the tests were started in the background (a shell
    starts those with SIGINT ignored, and Python then raises no KeyboardInterrupt)."""
    flags = [*GRID_FLAGS, "--epochs", "50"]
    with subprocess.Popen(
        [sys.executable, "-m", "cli", "sweep", *flags],
        cwd=REPO,
        env=cli_env(service),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            for s in service.client().sweeps():
                if s["status"] == "running":
                    with contextlib.suppress(ApiError):
                        service.client().cancel_sweep(s["id"])


@pytest.mark.slow
def test_ctrl_c_stops_watching_and_leaves_the_sweep_running(service: Service) -> None:
    with sweep_in_flight(service) as proc:
        assert proc.stderr is not None
        started = proc.stderr.readline()  # "sweep ID: 3 trials (...)"
        sweep_id = started.split()[1].rstrip(":")
        proc.stderr.readline()  # the first event's first line: the live view is up
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert f"trainq sweep cancel {sweep_id}" in err
        c = service.client()
        assert c.sweep(sweep_id)["status"] == "running"
        canceled = trainq(service, "sweep", "cancel", sweep_id)
        assert canceled.returncode == 0, canceled.stderr
        assert canceled.stdout.startswith(f"{sweep_id} canceled")
        wait_until(lambda: c.sweep(sweep_id)["budget"]["in_flight"] == 0, 30, "trials to stop")
        watched = trainq(service, "sweep", "watch", sweep_id)
        assert watched.returncode == 3 and "canceled (exit 3)" in watched.stderr

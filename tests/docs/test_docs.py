"""The docs run: every ```bash and ```python block of README.md and docs/*.md, in order, against
a live service (the API under uvicorn, a real redis-server, a CPU worker, SQLite), so a doc
that drifts from the code fails here, naming its file and line.

A page's blocks run as one bash script (`bash -euo pipefail`) in a fresh folder of its own:
its bash blocks share that folder and their variables, as in one terminal; each python block
runs as its own script of the venv's python. The environment is what a reader has after the
README's set-up: TRAINQ_API_URL and TRAINQ_API_KEY name the service, and `trainq`, `python`
and `curl` are on PATH. A block after `<!-- not run: reason -->` is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.pages import README, REPO, Block, blocks, pages
from tests.service import Service, free_port, fresh_service

pytestmark = pytest.mark.slow  # a live service and a few 1-epoch jobs: the full run, not --fast

PAGE_TIMEOUT_S = 300  # against a hang, not a time limit: a busy machine trains slowly
PY_END = "__TRAINQ_DOC_PYTHON_END__"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Service]:
    """One service for every page; each page's unfinished jobs are canceled after it."""
    with fresh_service(tmp_path_factory.mktemp("docs-svc"), data_dir) as service:
        service.start_worker()
        service.wait_for_workers(1)
        yield service


def script(page_blocks: list[Block], at: Path) -> str:
    """One bash script of the page's runnable blocks; each writes where it starts to `at`."""
    parts = []
    for b in page_blocks:
        if not b.runs:
            continue
        parts.append(f"echo '{b.where} ({b.lang})' > '{at}'")
        if b.lang == "python":
            parts.append(f"python - <<'{PY_END}'\n{b.text}{PY_END}")
        else:
            parts.append(b.text)
    return "\n".join(parts) + f"\necho done > '{at}'\n"


def shown(output: str | None, tail: int = 4000) -> str:
    """The end of a page's output, each progress bar's redrawn line (after a \\r) shown once."""
    lines = (line.rsplit("\r", 1)[-1] for line in (output or "").split("\n"))
    return "\n".join(lines)[-tail:]


def reader_env(svc: Service, folder: Path) -> dict[str, str]:
    """A reader's shell: the service's address and a key, this checkout's `trainq` and the
    venv's python first on PATH, and nothing else of trainq's from the outer environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    bin_dir = Path(sys.executable).parent
    env.update(
        TRAINQ_API_URL=svc.url,
        TRAINQ_API_KEY=svc.keys[0],
        TRAINQ_DATA_DIR=str(folder / "data"),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),  # this checkout's trainq, whatever the venv installed
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_page_runs(page: Path, svc: Service, tmp_path: Path) -> None:
    page_blocks = blocks(page)
    if not any(b.runs for b in page_blocks):
        pytest.skip(f"{page.name} has no block to run")
    at = tmp_path / "at"
    at.write_text("the first block")
    work = tmp_path / "work"
    work.mkdir()
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script(page_blocks, at)],
            cwd=work,
            env=reader_env(svc, tmp_path),
            capture_output=True,
            text=True,
            timeout=PAGE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        output = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        pytest.fail(
            f"{at.read_text().strip()} still running after {PAGE_TIMEOUT_S} s:\n{shown(output)}"
        )
    finally:
        svc.cancel_unfinished()
    failed = at.read_text().strip()
    assert done.returncode == 0 and failed == "done", (
        f"{failed} failed (exit {done.returncode}):\n"
        f"--- stdout\n{shown(done.stdout)}\n--- stderr\n{shown(done.stderr)}"
    )


def test_the_demo(tmp_path: Path) -> None:
    """The README's first command, `scripts/demo`, from the checkout's root as the README
    says, on a port and data folder of its own: it trains, follows and downloads."""
    first = next(b for b in blocks(README) if b.lang == "bash")
    assert first.text.startswith("scripts/demo"), f"{first.where} no longer starts the demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env.update(
        TRAINQ_PORT=str(free_port()), TRAINQ_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(REPO)
    )
    done = subprocess.run(
        ["scripts/demo", "--epochs", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"--- stdout\n{shown(done.stdout)}\n--- stderr\n{shown(done.stderr)}"
    )
    assert "artifacts/model.pt loads" in done.stderr + done.stdout

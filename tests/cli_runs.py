"""`trainq ARGV` run in the test's own process, through `cli.main.main` as the console
script calls it: a command's start-up (its imports) is paid once, not per case, and what it
prints and its exit code are read as a user's shell would see them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli.main import main


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_trainq(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    settings: dict[str, str],
    cwd: Path | None = None,
) -> Ran:
    """With exactly `settings` as the TRAINQ_ variables (any other unset), in `cwd`."""
    for name in [n for n in os.environ if n.startswith("TRAINQ_")]:
        monkeypatch.delenv(name)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    if cwd is not None:
        monkeypatch.chdir(cwd)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's --help and refusals, a missing key
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    out, err = capsys.readouterr()
    return Ran(code, out, err)

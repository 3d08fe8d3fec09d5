"""`trainq --help` and the commands that talk to the API load none of the server's or the
trainer's libraries: they stay quick, and they run on the light install (`pip install
trainq`, no extras). Each case runs in a fresh interpreter and reads its sys.modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "torch",
    "torchvision",
    "fastapi",
    "starlette",
    "sqlalchemy",
    "alembic",
    "uvicorn",
    "optuna",
)
# What the help of a command without spec options does not need either: the JobSpec (and so
# pydantic), the settings and the HTTP client load only when a command runs.
RUNTIME = ("pydantic", "pydantic_settings", "httpx", "tqdm")
# The API of a closed port: each client command fails at its first request.
DEAD_URL = "http://127.0.0.1:9"

RUN = """
import json, sys
from cli.main import main
try:
    main(sys.argv[1:])
except BaseException:
    pass  # --help exits; a client command fails to connect: only the imports matter
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def loaded(*argv: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env.update(TRAINQ_API_URL=DEAD_URL, TRAINQ_API_KEY="a-key")
    out = subprocess.run(
        [sys.executable, "-c", RUN, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["submit", "--help"],
        ["submit", "--epochs", "1"],
        ["ls"],
        ["ls", "--tag", "x", "--status", "succeeded", "--sort", "-test_accuracy", "--name", "p"],
        ["tag", "0f8b7f4e-4d1c-4e55-9a3e-8d2c6f0e7a11", "+a", "-b"],
        ["rename", "0f8b7f4e-4d1c-4e55-9a3e-8d2c6f0e7a11", "a name"],
        ["note", "0f8b7f4e-4d1c-4e55-9a3e-8d2c6f0e7a11", "why"],
        ["watch", "0f8b7f4e-4d1c-4e55-9a3e-8d2c6f0e7a11"],
        ["cancel", "0f8b7f4e-4d1c-4e55-9a3e-8d2c6f0e7a11"],
        ["download", "0f8b7f4e-4d1c-4e55-9a3e-8d2c6f0e7a11"],
        ["usage"],
        ["sweep", "--help"],
        ["sweep", "--lr", "loguniform:1e-4,1e-2", "--batch-size", "64,128"],
        ["sweep", "watch", "0f8b7f4e-4d1c-4e55-9a3e-8d2c6f0e7a11"],
        ["sweep", "list"],
        ["compare", "0f8b7f4e-4d1c-4e55-9a3e-8d2c6f0e7a11", "5e1f0c9a-4d1c-4e55-9a3e-8d2c6f0e7a11"],
        ["webhook", "ls"],
        ["webhook", "add", "https://hooks.example/in", "--event", "job.failed"],
    ],
    ids=" ".join,
)
def test_client_commands_load_no_heavy_module(argv: list[str]) -> None:
    assert loaded(*argv) & set(HEAVY) == set()


@pytest.mark.slow
def test_data_install_loads_no_heavy_module(tmp_path: Path) -> None:
    """It fetches and verifies with the standard library alone (where npm is missing, it
    stops at its message: the imports are the same)."""
    argv = ("data", "install", "mnist", "--data-dir", str(tmp_path))
    assert loaded(*argv) & set(HEAVY) == set()


def test_data_upload_loads_no_heavy_module(tmp_path: Path) -> None:
    """A folder is archived and sent with the standard library and httpx alone."""
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "0.png").write_bytes(b"not read here")
    assert loaded("data", "upload", str(tmp_path)) & set(HEAVY) == set()


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["watch", "--help"], ["cancel", "--help"], ["download", "--help"]],
    ids=" ".join,
)
def test_help_builds_only_the_parser(argv: list[str]) -> None:
    assert loaded(*argv) & set(RUNTIME) == set()


def test_an_invalid_spec_is_named_field_by_field() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "submit", "--epochs", "0", "--lr", "fast"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines()[0] == "invalid job spec:"
    assert "epochs: " in out.stderr and "lr: " in out.stderr


@pytest.mark.parametrize("command", ["submit", "train", "sweep"])
def test_the_spec_options_help_prints(command: str) -> None:
    """Every JobSpec field's description goes through argparse's %-formatting."""
    out = subprocess.run(
        [sys.executable, "-m", "cli", command, "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "--augment" in out.stdout and "10%" in out.stdout


def test_the_help_still_names_every_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    for name in (
        "submit",
        "ls",
        "watch",
        "cancel",
        "download",
        "data",
        "train",
        "sweep",
        "compare",
        "tag",
        "rename",
        "note",
    ):
        assert name in out.stdout
    for name in ("migrate", "serve", "worker", "up"):
        assert name in out.stdout


def test_download_offers_every_model_format() -> None:
    from cli.options import MODEL_FORMATS
    from core.spec import ExportFormat

    assert tuple(ExportFormat) == MODEL_FORMATS

"""What the CLI says when something a user can meet goes wrong: with the API away, every
command that talks to it prints one line and exits 69, the code `trainq --help` lists;
`--url` names the API over the environment; a spec field that may be null takes `null`."""

from __future__ import annotations

import argparse
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cli.options import add_spec_options, spec_from_args
from tests.cli_runs import Ran, run_trainq

DEAD_URL = "http://127.0.0.1:9"  # a closed port
JOB = "0f8b7f4e-4d1c-4e55-9a3e-8d2c6f0e7a11"
Trainq = Callable[..., Ran]


@pytest.fixture
def trainq(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Trainq:
    """`trainq(*argv)` with TRAINQ_API_URL at a closed port."""

    def run(*argv: str) -> Ran:
        settings = {"TRAINQ_API_URL": DEAD_URL, "TRAINQ_API_KEY": "a-key"}
        return run_trainq(capsys, monkeypatch, list(argv), settings)

    return run


@pytest.mark.parametrize(
    "argv",
    [
        ["ls"],
        ["submit", "--epochs", "1"],
        ["watch", JOB],
        ["watch", JOB[:8]],
        ["cancel", JOB[:8]],
        ["download", JOB[:8]],
        ["usage"],
        ["compare", JOB, JOB[:8]],
        ["sweep", "--lr", "1e-3,1e-2"],
        ["sweep", "list"],
        ["sweep", "watch", JOB[:8]],
        ["sweep", "show", JOB],
        ["sweep", "cancel", JOB[:8]],
    ],
    ids=" ".join,
)
def test_with_the_api_away_each_command_prints_one_line(trainq: Trainq, argv: list[str]) -> None:
    out = trainq(*argv)
    assert out.returncode == 69, out.stderr
    assert out.stderr == f"trainq: cannot reach the API at {DEAD_URL}: connection refused\n"


def test_url_overrides_the_environment(trainq: Trainq) -> None:
    out = trainq("ls", "--url", "http://127.0.0.1:7")
    assert out.returncode == 69
    assert out.stderr.startswith("trainq: cannot reach the API at http://127.0.0.1:7: ")


def test_the_help_lists_the_exit_codes(trainq: Trainq) -> None:
    out = trainq("--help")
    assert out.returncode == 0, out.stderr
    assert "69   the API cannot be reached" in out.stdout


def spec_of(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_spec_options(parser)
    return spec_from_args(parser.parse_args(argv)).model_dump(mode="json")


def test_a_field_that_may_be_null_takes_null() -> None:
    spec = spec_of("--ema-decay", "null", "--max-steps", "null", "--grad-clip-norm", "null")
    assert spec["ema_decay"] is None and spec["max_steps"] is None
    assert spec["grad_clip_norm"] is None
    assert spec_of("--ema-decay", "0.99")["ema_decay"] == 0.99


def test_null_is_refused_where_the_field_cannot_be_null(trainq: Trainq) -> None:
    out = trainq("submit", "--epochs", "null", "--lr", "null")
    assert out.returncode == 2
    assert "epochs: " in out.stderr and "lr: " in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def cut_url() -> Iterator[str]:
    """An API that takes the connection, reads a little of the request and dies (reset):
    as an API killed in the middle of an upload does."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)

    def accept() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            conn.recv(4096)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    thread.join(10)
    server.close()


def test_an_api_that_dies_mid_upload_is_not_called_unreachable(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    cut_url: str,
) -> None:
    upload = tmp_path / "set.npz"
    upload.write_bytes(bytes(4 << 20))
    settings = {"TRAINQ_API_URL": cut_url, "TRAINQ_API_KEY": "a-key"}
    ran = run_trainq(capsys, monkeypatch, ["data", "upload", str(upload), "--name", "s"], settings)
    assert ran.returncode == 69, ran
    assert "cannot reach" not in ran.stderr, ran.stderr
    assert f"the API at {cut_url} ended the connection before it answered" in ran.stderr, ran.stderr
    assert "may still be stored" in ran.stderr, ran.stderr

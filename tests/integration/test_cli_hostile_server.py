"""`trainq download [--check]` against a server that lies: a server of the test's own (real
HTTP, http.server in a thread) answering as the API would, with hostile text, bodies and
files. Each is one line on the terminal and a non-zero exit, never a traceback, and nothing
the server sent reaches the terminal unescaped."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from client.http import ApiError, Client
from tests.cli_runs import run_trainq

JOB = "11111111-2222-3333-4444-555555555555"
ESCAPES = "\x1b]2;PWNED\x07\x1b[31mRED\x1b[0m\r\nfake: line\x9b31m\u202e"


@dataclass
class Script:
    """What the fake API answers: the job's JSON, and the model's body and headers."""

    job: dict[str, Any] = field(
        default_factory=lambda: {"id": JOB, "default_format": "torchscript"}
    )
    model: bytes = b"model"
    etag: str | None = None
    length: bool = True
    error: tuple[int, Any] | None = None  # (status, detail) for every route


def fake_api(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            pass

        def _json(self, status: int, body: Any) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            path = self.path.partition("?")[0]
            if script.error is not None:
                status, detail = script.error
                return self._json(status, {"detail": detail})
            if path == f"/jobs/{JOB}":
                return self._json(200, script.job)
            if path == f"/jobs/{JOB}/record":
                return self._json(200, {"dataset": {"image_shape": [1, 28, 28]}})
            if path == f"/jobs/{JOB}/model":
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                if script.etag is not None:
                    self.send_header("ETag", f'"{script.etag}"')
                if script.length:
                    self.send_header("Content-Length", str(len(script.model)))
                else:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(script.model)
                self.close_connection = True
                return None
            return self._json(404, {"detail": "not found"})

    return Handler


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(script: Script) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), fake_api(script))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def download(capsys: Any, monkeypatch: Any, url: str, out: Path, *more: str) -> Any:
    argv = ["download", JOB, "--url", url, "--key", "k", "-o", str(out), *more]
    return run_trainq(capsys, monkeypatch, argv, {})


def test_the_servers_text_reaches_the_terminal_escaped(
    serve: Any, capsys: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    for status, detail in [(404, ESCAPES), (422, [{"loc": ["body", ESCAPES], "msg": ESCAPES}])]:
        url = serve(Script(error=(status, detail)))
        ran = download(capsys, monkeypatch, url, tmp_path / "m.pt")
        assert ran.returncode != 0
        for raw in ("\x1b", "\x07", "\r", "\x9b", "\u202e"):
            assert raw not in ran.stderr, (status, ran.stderr)
        assert "\\x1b]2;PWNED" in ran.stderr and "fake: line" in ran.stderr
        assert ran.stderr.count("\n") <= 2, ran.stderr  # the forged line is not a line


def test_an_unknown_default_format_is_one_line(
    serve: Any, capsys: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    url = serve(Script(job={"id": JOB, "default_format": "evil\x1b[2J"}))
    ran = download(capsys, monkeypatch, url, tmp_path / "m.pt")
    assert ran.returncode == 1, ran
    assert "Traceback" not in ran.stderr and "\x1b" not in ran.stderr
    assert ran.stderr.count("\n") == 1 and "evil" in ran.stderr


def test_a_body_that_fails_its_sha256_is_not_kept(
    serve: Any, capsys: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    url = serve(Script(model=b"tampered", etag=hashlib.sha256(b"model").hexdigest()))
    ran = download(capsys, monkeypatch, url, tmp_path / "m.pt")
    assert ran.returncode == 1 and "sha256" in ran.stderr, ran
    assert list(tmp_path.iterdir()) == []


def test_a_download_without_a_sha256_says_it_is_not_verified(
    serve: Any, capsys: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    url = serve(Script(model=b"model", etag=None))
    ran = download(capsys, monkeypatch, url, tmp_path / "m.pt")
    assert ran.returncode == 0, ran
    assert "not verified" in ran.stderr and (tmp_path / "m.pt").read_bytes() == b"model"
    url = serve(Script(model=b"model", etag="W/not-a-sha256"))
    ran = download(capsys, monkeypatch, url, tmp_path / "n.pt")
    assert "not verified" in ran.stderr


def test_a_body_past_the_bound_is_refused_and_not_kept(serve: Any, tmp_path: Path) -> None:
    """Without a Content-Length (the body ends when the server closes), and past one."""
    for length in (False, True):
        url = serve(Script(model=b"x" * 10_000, length=length))
        with Client(url, "k") as c, pytest.raises(ApiError, match="more than 4096 bytes"):
            c.download(JOB, tmp_path / "m.pt", max_bytes=4096)
        assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "model",
    [b"PK\x03\x04 not a model at all", b"\x00" * 100],
)
def test_check_of_a_model_that_does_not_load_is_one_line(
    serve: Any, capsys: Any, monkeypatch: Any, tmp_path: Path, model: bytes
) -> None:
    url = serve(Script(model=model, etag=hashlib.sha256(model).hexdigest()))
    ran = download(capsys, monkeypatch, url, tmp_path / "m.pt", "--check")
    assert ran.returncode == 1, ran
    assert "Traceback" not in ran.stderr and "--check" in ran.stderr
    assert ran.stderr.strip().count("\n") <= 1, ran.stderr


def test_check_of_a_model_whose_forward_fails_is_one_line(
    serve: Any, capsys: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    import io
    import warnings

    import torch

    class Huge(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.zeros(x.shape[0], 17592186044416)  # 64 TiB of float32

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit: what trainq's exports are
        torch.jit.save(torch.jit.script(Huge()), buf)
    model = buf.getvalue()
    url = serve(Script(model=model, etag=hashlib.sha256(model).hexdigest()))
    ran = download(capsys, monkeypatch, url, tmp_path / "m.pt", "--check")
    assert ran.returncode == 1, ran
    assert "Traceback" not in ran.stderr and "--check" in ran.stderr

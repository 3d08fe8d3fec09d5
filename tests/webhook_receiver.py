"""A real HTTP server on loopback that webhooks are delivered to, and the Standard Webhooks
check of what it received: written from the convention's text (www.standardwebhooks.com),
and the `standardwebhooks` package's own verifier where that is installed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.service import wait_until

# What the n-th request (from 0) is answered: status, headers, body.
Answer = Callable[[int], tuple[int, dict[str, str], bytes]]
TOLERANCE_S = 300  # the convention's verifiers accept timestamps this far from now


def ok(_: int) -> tuple[int, dict[str, str], bytes]:
    return 200, {}, b"ok"


@dataclass
class Received:
    headers: dict[str, str]  # lower-case names
    body: bytes
    at: float  # time.time() when its body had arrived

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


@dataclass
class Receiver:
    host: str = "127.0.0.1"
    answer: Answer = ok
    received: list[Received] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._lock:
                    n = len(receiver.received)
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.received.append(Received(headers, body, time.time()))
                status, extra, answer = receiver.answer(n)
                try:
                    self.send_response(status)
                    for name, value in extra.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # the sender gave up waiting (a timeout, a killed dispatcher)

            def log_message(self, *_: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # many deliveries connect at once

        self._server = Server((self.host, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def wait_for(self, n: int, timeout: float = 60) -> list[Received]:
        wait_until(lambda: len(self.received) >= n, timeout, f"{n} webhook deliveries")
        with self._lock:
            return list(self.received)


def verify(secret: str, got: Received, now: float | None = None) -> None:
    """AssertionError unless `got` is signed by `secret` as Standard Webhooks prescribes:
    a `v1,` signature among those of `webhook-signature` that is the base64 HMAC-SHA256,
    keyed by the secret's base64-decoded bytes after `whsec_`, of
    `{webhook-id}.{webhook-timestamp}.{body}`, with a timestamp within five minutes."""
    msg_id, stamp = got.headers["webhook-id"], got.headers["webhook-timestamp"]
    assert "." not in msg_id and stamp.isdigit(), got.headers
    assert abs((now or time.time()) - int(stamp)) <= TOLERANCE_S, stamp
    assert secret.startswith("whsec_")
    key = base64.b64decode(secret[len("whsec_") :])
    assert 24 <= len(key) <= 64
    signed = f"{msg_id}.{stamp}.".encode() + got.body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    offered = got.headers["webhook-signature"].split(" ")
    assert any(hmac.compare_digest(expected, s) for s in offered), offered


def verify_with_library(secret: str, got: Received) -> bool:
    """The `standardwebhooks` package's verifier on `got` (raising if it refuses); False
    where the package is not installed."""
    try:
        from standardwebhooks import Webhook  # type: ignore[import-not-found]
    except ImportError:
        return False
    Webhook(secret).verify(got.body, got.headers)
    return True

"""Faults at the wire: a TCP proxy on loopback between a trainq process and Redis.

It forwards bytes both ways and, on request, does what a real network does to a client:
- `partition()` / `heal()`: stop forwarding in both directions without closing anything (the
  peer neither answers nor refuses: only a socket timeout notices);
- `cut()`: close every connection at once (a reset);
- `drop_reply(pattern, count)`: forward the next `count` client writes that contain `pattern`,
  then swallow what the server answers and cut that connection: the command ran, its reply
  was lost;
- `delay(seconds)`: hold every chunk that long before forwarding it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field

CHUNK = 1 << 16


@dataclass(eq=False)
class _Link:
    client: socket.socket
    server: socket.socket
    doomed: bool = False  # a reply to swallow: cut after the server's next bytes

    def close(self) -> None:
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


@dataclass(eq=False)
class WireProxy:
    target_port: int
    target_host: str = "127.0.0.1"
    port: int = 0
    links: set[_Link] = field(default_factory=set)
    dropped: int = 0  # replies swallowed so far
    _listener: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _open: threading.Event = field(default_factory=threading.Event)  # set: forwarding
    _closed: bool = False
    _drop_pattern: bytes = b""
    _drop_left: int = 0
    _delay_s: float = 0.0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> WireProxy:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self.port = self._listener.getsockname()[1]
        self._open.set()
        threading.Thread(target=self._accept, name="wire-accept", daemon=True).start()
        return self

    def close(self) -> None:
        self._closed = True
        self._open.set()
        if self._listener is not None:
            # Shut down first: a close alone leaves the socket listening (its port taken)
            # until the accept blocked on it in the other thread returns.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self._listener.close()
        self.cut()

    def partition(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def cut(self) -> None:
        with self._lock:
            links, self.links = list(self.links), set()
        for link in links:
            link.close()

    def drop_reply(self, pattern: bytes, count: int = 1) -> None:
        with self._lock:
            self._drop_pattern, self._drop_left = pattern, count

    def delay(self, seconds: float) -> None:
        self._delay_s = seconds

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((self.target_host, self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            link = _Link(client, server)
            with self._lock:
                self.links.add(link)
            for up in (True, False):
                threading.Thread(target=self._pump, args=(link, up), daemon=True).start()

    def _pump(self, link: _Link, upstream: bool) -> None:
        src, dst = (link.client, link.server) if upstream else (link.server, link.client)
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                self._open.wait()
                if self._closed:
                    break
                if self._delay_s:
                    time.sleep(self._delay_s)
                if upstream:
                    self._arm(link, data)
                elif link.doomed:
                    self.dropped += 1
                    break  # the reply is swallowed; the client sees its connection cut
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self.links.discard(link)
            link.close()

    def _arm(self, link: _Link, data: bytes) -> None:
        with self._lock:
            if self._drop_left and self._drop_pattern in data:
                self._drop_left -= 1
                link.doomed = True

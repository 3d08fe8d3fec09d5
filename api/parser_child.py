"""A parser child: the process that reads untrusted bytes for the API (an upload's archive,
.npz or IDX files; a predict request's image files), so that a parser bug costs this
process and a clear 4xx, never the API. It binds itself before it reads anything: it ends
with the API (killed, stopped or not: the API starts every child from one thread that lives
as long as it does, which the parent-death signal follows), has an address-space limit, no
core dumps, a CPU-seconds limit set anew for each request, no network (its own empty network
namespace where the kernel allows, else Python's sockets refused), and nowhere to write: no
byte to any file (RLIMIT_FSIZE 0), a TMPDIR under /dev/null, stderr to /dev/null. It still
runs as the API's user: run trainq as a user of its own. Then it answers frames
(api.parser_wire) on stdin and stdout, one request at a time, until stdin closes. Started
only by api.parser_pool. See docs/datasets.md ("Parsing in a child")."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, NoReturn

from api.parser_wire import Frame
from core.lifetime import ParentGone, end_with_parent

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000  # linux/sched.h
MAX_REQUEST = 256 << 20  # an upload's body is at most 200 MiB
# A decode that holds at most this much asks the API's budget nothing: the pool's size
# (Settings.predict_parsers, one decode a child) bounds what such decodes hold, and a
# round trip a file would cost more than the decode.
UNRESERVED_DECODE = 8 << 20


def main() -> None:
    limits = json.loads(sys.argv[1])
    try:
        # SIGKILL: a child stopped, or deep in a decode, ends with the API all the same.
        end_with_parent(int(limits["parent"]), signal.SIGKILL)
    except ParentGone:
        sys.exit(1)
    network = _no_network()
    _bound(int(limits["memory"]))
    # Imported only now, within the limits: the parsers are what is not trusted.
    from api.images import give_back_large_buffers
    from api.parser_ops import answer

    give_back_large_buffers()  # the decodes are here now: their pixels go back as freed

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    _send(stdout, Frame({"ready": True, "network": network}))
    while True:
        try:
            request = Frame.read(stdin.read, MAX_REQUEST)
        except Exception:  # stdin closed (the pool is done with this child), or garbage
            return
        _limit_cpu(float(request.header.get("cpu_s", 10)))
        reply = answer(request, _RemoteBudget(stdin, stdout))
        _send(stdout, reply)
        if reply.header.get("retire"):
            return  # after a MemoryError or a parser crash: a fresh child takes its place


def _no_network() -> str:
    """Cut this process off the network: a network namespace of its own (no interface but
    a loopback that is down), else refuse sockets in Python. Says which held."""
    libc = ctypes.CDLL(None, use_errno=True)
    for flags in (CLONE_NEWNET, CLONE_NEWUSER | CLONE_NEWNET):
        if libc.unshare(flags) == 0:
            return "namespace"
    import _socket

    socket.socket = _socket.socket = _refused  # type: ignore[assignment,misc]
    socket.create_connection = socket.socketpair = socket.fromfd = _refused
    return "sockets refused"


def _refused(*_: Any, **__: Any) -> NoReturn:
    raise PermissionError("a parser child has no network")


def _bound(memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # no byte written to any file


def _limit_cpu(seconds: float) -> None:
    """SIGXCPU (which ends this process) once this request has used `seconds` of CPU: the
    soft limit is set past what the process has used so far, under no hard limit."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    soft = int(spent + max(seconds, 1.0)) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))


def _send(out: IO[bytes], frame: Frame) -> None:
    out.write(frame.encode_head())
    out.write(frame.payload)  # as it is: a data set's .npz is not copied into a frame
    out.flush()


class _RemoteBudget:
    """The API's decode budget (api.images.KeyBudget), asked over the pipe: a decode of
    over UNRESERVED_DECODE bytes reserves them there before it decodes, and gives them back
    as it ends (as does the answer to the request)."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self._in, self._out = stdin, stdout

    @contextmanager
    def reserve(self, size: int) -> Iterator[None]:
        from api.images import DecodeBusy

        if size <= UNRESERVED_DECODE:
            yield
            return
        _send(self._out, Frame({"reserve": size}))
        reply = Frame.read(self._in.read, 0)
        if not reply.header.get("granted"):
            raise DecodeBusy(str(reply.header.get("busy", "the decode budget is busy")))
        try:
            yield
        finally:
            _send(self._out, Frame({"release": True}))


if __name__ == "__main__":
    os.umask(0o077)
    main()

"""A pool of parser children (api.parser_child) of one kind, and the API's side of the pipe
to each: `ParserPool.call` hands a request to an idle child (starting one while fewer than
`size` live, holding at most `per_key` of them for one key) and reads its answer.

The child binds itself (address space, CPU seconds per request, no network); the pool adds
a wall-clock deadline per request, killing a child that passes it, and trusts a child's
answer no more than an upload: a frame past its request's bounds, or more messages than
the request may take, ends the child. A child that died, overran a limit or raised anything
but a refusal is replaced. See docs/datasets.md ("Parsing in a child")."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass

from api.parser_wire import Frame, WireError

log = logging.getLogger(__name__)

START_S = 15.0  # a child's start: Python, numpy and Pillow imported
NOWHERE = "/dev/null/trainq-parser"  # a child's TMPDIR and HOME
# Every child is started from this one thread, which lives as long as the process: a
# child's parent-death signal (api.parser_child) follows the thread that started it, and a
# request's thread (the API's threadpool) may end while its child is kept.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parser-spawner")


@dataclass(frozen=True)
class Limits:
    """What one child of a pool may take."""

    memory: int  # bytes of address space
    cpu_s: float  # CPU seconds for one request
    wall_s: float  # seconds for one request, waiting for the decode budget included
    requests: int = 1000  # requests a child answers before a fresh one takes its place


@dataclass(frozen=True)
class Bounds:
    """What one request's answer may be: the payload's bytes, and how many reserve and
    release messages may come before it."""

    reply: int
    messages: int = 0


def wall_s(cpu_s: float) -> float:
    """The clock's limit for a request of `cpu_s` CPU seconds: past the kernel's (whole
    seconds, one more than asked: api.parser_child), thrice over, for a busy machine."""
    return 3 * (max(cpu_s, 1.0) + 2)


class ParserFailed(Exception):
    """The child ended, or was ended, before it answered: `why` says how, as a refusal's
    message reads it ("needs more than 2 GiB of memory to read")."""

    def __init__(self, why: str, *, limit: bool = False, killed: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.limit = limit  # a limit of ours ended it (memory, CPU, wall clock), not a crash
        # Killed from outside (the kernel's OOM killer, an operator): not the input's doing.
        self.killed = killed


class Refused(Exception):
    """The child refused the input on purpose: `kind` names the exception it raised."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class PoolBusy(Exception):
    """Every child this request may take is busy, and none came free in time."""


class PoolDown(Exception):
    """No child could be started (no room for its folder, no process to be had)."""


# On a reserve message from the child: enter the reservation (or raise to refuse it).
OnReserve = Callable[[int, ExitStack], None]


# The child's command line, after the interpreter (-P: no working directory on its path).
CHILD = ("-P", "-m", "api.parser_child")


class _Child:
    def __init__(self, limits: Limits, command: tuple[str, ...]) -> None:
        self.limits = self.budget = limits  # budget: the request's own, set by the pool
        self.answered = 0
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            # Nowhere to write: a path under a file that is no folder (and no byte may be
            # written to any file: api.parser_child sets RLIMIT_FSIZE to 0).
            "TMPDIR": NOWHERE,
            "HOME": NOWHERE,
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            # One thread each: a parse is one request's work, and threads cost address space.
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MALLOC_ARENA_MAX": "2",
        }
        spec = json.dumps({"memory": limits.memory, "parent": os.getpid()})
        self.proc = _SPAWNER.submit(
            subprocess.Popen,
            [sys.executable, *command, spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # it writes nowhere: what it has to say is framed
            cwd="/",
            env=env,
            close_fds=True,
        ).result()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self._in, False)
        os.set_blocking(self._out, False)
        try:
            hello = self._recv(time.monotonic() + START_S, 0)
        except BaseException:
            self.kill()
            raise
        self.network = str(hello.header.get("network"))

    def exchange(
        self, request: Frame, deadline: float, bounds: Bounds, on_reserve: OnReserve
    ) -> Frame:
        """The child's answer to `request`, its reserve messages handled meanwhile."""
        messages = 0
        with ExitStack() as held:
            self._send(request.encode_head(), deadline)
            self._send(request.payload, deadline)
            while True:
                reply = self._recv(deadline, bounds.reply)
                if "release" not in reply.header and "reserve" not in reply.header:
                    self.answered += 1
                    return reply
                messages += 1
                if messages > bounds.messages:
                    raise WireError(f"over {bounds.messages} reserve and release messages")
                if "release" in reply.header:
                    held.close()
                else:
                    self._send(self._grant(reply.header["reserve"], held, on_reserve), deadline)

    @staticmethod
    def _grant(size: object, held: ExitStack, on_reserve: OnReserve) -> bytes:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise WireError(f"a reserve of {size!r} bytes")
        try:
            on_reserve(size, held)
        except Exception as e:  # the budget's refusal, told to the child
            return Frame({"granted": False, "busy": str(e)}).encode()
        return Frame({"granted": True}).encode()

    def _send(self, data: bytes | bytearray, deadline: float) -> None:
        view = memoryview(data)
        while view:
            self._wait(self._in, select.POLLOUT, deadline)
            try:
                view = view[os.write(self._in, view) :]
            except BrokenPipeError:
                raise self._ended() from None

    def _recv(self, deadline: float, max_payload: int) -> Frame:
        def read_into(buffer: memoryview) -> None:
            while buffer:
                self._wait(self._out, select.POLLIN, deadline)
                got = os.readv(self._out, [buffer])
                if not got:
                    raise self._ended()
                buffer = buffer[got:]

        def read_exactly(n: int) -> bytes:
            out = bytearray(n)
            read_into(memoryview(out))
            return bytes(out)

        return Frame.read(read_exactly, max_payload, read_into)

    def _wait(self, fd: int, event: int, deadline: float) -> None:
        poll = select.poll()
        poll.register(fd, event)
        left = max(deadline - time.monotonic(), 0.0)
        if not poll.poll(left * 1000):  # what is ready is read, even past the deadline
            self.kill()
            raise ParserFailed(
                f"took over {self.budget.wall_s:g} s to read (the most a request may)", limit=True
            )

    def _ended(self) -> ParserFailed:
        """Why the child is gone, from how it ended."""
        self.kill()
        code = self.proc.returncode
        if code == -signal.SIGXCPU:
            return ParserFailed(
                f"took over {self.budget.cpu_s:g} CPU seconds to read (the most a request may)",
                limit=True,
            )
        if code == -signal.SIGKILL:  # never ours: RLIMIT_AS raises MemoryError instead
            return ParserFailed("was being read by a parser that was killed", killed=True)
        return ParserFailed(f"ended the parser (exit {code})")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()

    def close(self) -> None:
        """Close its stdin, which ends it, then reap it."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        self.kill()


class ParserPool:
    """Up to `size` children of one kind: `call` hands a request to an idle one (starting
    one while fewer than `size` live), waiting up to `wait_s` for one this request's key may
    take (at most `per_key` of them at once)."""

    def __init__(
        self,
        name: str,
        size: int,
        limits: Limits,
        wait_s: float = 5.0,
        per_key: int = 0,
        command: tuple[str, ...] = CHILD,
    ) -> None:
        self.name, self.size, self.limits, self.wait_s = name, size, limits, wait_s
        self.command = command
        self.per_key = per_key or size
        self._idle: list[_Child] = []
        self._live = 0
        self._held: Counter[str] = Counter()
        self._closed = False
        self._changed = threading.Condition()

    def warm(self, count: int = 1) -> None:
        """Start up to `count` children now, so that the first requests find them ready."""
        for _ in range(min(count, self.size)):
            with self._changed:
                if self._live >= self.size or self._closed:
                    return
                self._live += 1
            try:
                child = self._start()
            except PoolDown as e:
                log.warning("could not start a %s parser: %s", self.name, e)
                return
            self._give_back(child)

    def call(
        self,
        request: Frame,
        bounds: Bounds,
        *,
        owner: str = "",
        cpu_s: float | None = None,
        wall_s: float | None = None,
        on_reserve: OnReserve | None = None,
    ) -> Frame:
        """The child's answer, within `bounds`; Refused for a refusal it made; ParserFailed if
        it ended or was ended first; PoolBusy if no child `owner` may take came free within
        wait_s; PoolDown if none could be started."""
        limits = self.limits
        budget = Limits(
            limits.memory,
            limits.cpu_s if cpu_s is None else cpu_s,
            limits.wall_s if wall_s is None else wall_s,
        )
        child = self._take(owner)
        child.budget = budget
        deadline = time.monotonic() + budget.wall_s
        request = Frame({**request.header, "cpu_s": budget.cpu_s}, request.payload)
        sound = False
        try:
            reply = child.exchange(request, deadline, bounds, on_reserve or _no_reserve)
            sound = not reply.header.get("retire") and child.answered < limits.requests
        except WireError as e:
            child.kill()
            raise ParserFailed(
                f"ended the parser (it answered out of turn: {e})", limit=False
            ) from e
        finally:
            self._return(child, owner, sound)
        error = reply.header.get("error")
        if error is None:
            return reply
        if error == "MemoryError":
            raise ParserFailed(
                f"needs more than {limits.memory >> 20} MiB of memory to read", limit=True
            )
        if error == "Crash":
            log.warning("a %s parser failed: %.2000s", self.name, reply.header.get("message"))
        raise Refused(str(error), str(reply.header.get("message", "")))

    def _take(self, owner: str) -> _Child:
        with self._changed:
            if self._closed:
                raise PoolDown(f"the {self.name} parsers are closed")
            ready = self._changed.wait_for(
                lambda: (
                    (bool(self._idle) or self._live < self.size)
                    and self._held[owner] < self.per_key
                ),
                self.wait_s,
            )
            if not ready:
                mine = self._held[owner] >= self.per_key
                raise PoolBusy(
                    f"this key holds {self.per_key} of the {self.size} {self.name} parsers"
                    if mine
                    else f"all {self.size} {self.name} parsers of this API process are busy"
                )
            self._held[owner] += 1
            while self._idle:
                child = self._idle.pop()
                if child.proc.poll() is None:
                    return child
                child.kill()  # it died idle (killed, or its parent's signal): never handed work
                self._live -= 1
            self._live += 1
        try:
            return self._start()
        except BaseException:
            self._release(owner)
            raise

    def _start(self) -> _Child:
        """A new child, counted in _live already; PoolDown if it could not start."""
        try:
            return _Child(self.limits, self.command)
        except BaseException as e:
            with self._changed:
                self._live -= 1
                self._changed.notify_all()
            if isinstance(e, OSError | ParserFailed | WireError):
                raise PoolDown(f"{type(e).__name__}: {e}") from e
            raise

    def _release(self, owner: str) -> None:
        with self._changed:
            self._held[owner] -= 1
            if self._held[owner] <= 0:
                del self._held[owner]
            self._changed.notify_all()

    def _return(self, child: _Child, owner: str, sound: bool) -> None:
        self._release(owner)
        if sound:
            self._give_back(child)
            return
        child.close() if child.proc.poll() is None else child.kill()
        with self._changed:
            self._live -= 1
            self._changed.notify_all()

    def _give_back(self, child: _Child) -> None:
        with self._changed:
            if not self._closed:
                self._idle.append(child)
                self._changed.notify_all()
                return
            self._live -= 1
        child.close()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._changed.notify_all()
        for child in idle:
            child.close()


def _no_reserve(size: int, held: ExitStack) -> None:
    raise WireError(f"a reserve of {size} bytes, where this request has no budget")

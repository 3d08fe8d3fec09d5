"""The API's parser children: every untrusted file (an upload's archive, .npz or IDX files;
each image sent to predict) is read in a child process (api.parser_child) with hard limits,
so that a parser bug costs one child and a clear 4xx, never the API's memory or its slots.

A `ParserPool` keeps up to `size` children of one kind warm and hands each request to an
idle one, over a pipe (api.parser_wire): the child has an address-space limit, a CPU-seconds
limit per request and no network; the pool adds a wall-clock deadline per request and
kills a child that passes it. A child that died, overran a limit or raised anything but a
refusal is replaced. See docs/datasets.md ("Parsing in a child")."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from api.images import DECODE_WAIT_S, DecodeBudget, DecodeBusy, ImageRejected, KeyBudget
from api.parser_wire import Frame, WireError
from api.photo_sets import PhotoOptions
from core.config import Settings
from core.datasets import ParsedDataset
from core.errors import DatasetTooLarge, InvalidDataset

log = logging.getLogger(__name__)

START_S = 15.0  # a child's start: Python, numpy and Pillow imported
MAX_REPLY = 2 << 30  # a data set's canonical .npz holds at most 1 GiB of pixels
IMAGE_PARSER_MEMORY = 1 << 30  # one image: at most 64 MiB decoded, as much in coefficients
IMAGE_CPU_S = 5.0
IMAGE_WALL_S = DECODE_WAIT_S + 10.0  # the decode budget's wait, then the decode
MAX_MESSAGE = 2000  # characters of a child's refusal passed on


@dataclass(frozen=True)
class Limits:
    """What one child of a pool may take."""

    memory: int  # bytes of address space
    cpu_s: float  # CPU seconds for one request
    wall_s: float  # seconds for one request, waiting for the decode budget included
    requests: int = 1000  # requests a child answers before a fresh one takes its place


def wall_s(cpu_s: float) -> float:
    """The clock's limit for a request of `cpu_s` CPU seconds: past the kernel's (whole
    seconds, one more than asked: api.parser_child), thrice over, for a busy machine."""
    return 3 * (max(cpu_s, 1.0) + 2)


class ParserFailed(Exception):
    """The child ended, or was ended, before it answered: `why` says how, as a refusal's
    message reads it ("needs more than 2 GiB of memory to read")."""

    def __init__(self, why: str, *, limit: bool) -> None:
        super().__init__(why)
        self.why = why
        self.limit = limit  # a limit of ours ended it (memory, CPU, wall clock), not a crash


class Refused(Exception):
    """The child refused the input on purpose: `kind` names the exception it raised."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class PoolBusy(Exception):
    """Every child of the pool is busy, and none came free in time."""


# On a reserve message from the child: enter the reservation (or raise to refuse it).
OnReserve = Callable[[int, ExitStack], None]


class _Child:
    def __init__(self, limits: Limits) -> None:
        self.limits = self.budget = limits  # budget: the request's own, set by the pool
        self.answered = 0
        self.home = tempfile.mkdtemp(prefix="trainq-parser-")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TMPDIR": self.home,
            "HOME": self.home,
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            # One thread each: a parse is one request's work, and threads cost address space.
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MALLOC_ARENA_MAX": "2",
        }
        spec = json.dumps({"memory": limits.memory, "parent": os.getpid()})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "api.parser_child", spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=self.home,
            env=env,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self._in, False)
        os.set_blocking(self._out, False)
        hello = self._recv(time.monotonic() + START_S, 0)
        self.network = str(hello.header.get("network"))

    def exchange(self, request: Frame, deadline: float, on_reserve: OnReserve) -> Frame:
        """The child's answer to `request`, its reserve messages handled meanwhile."""
        with ExitStack() as held:
            self._send(request.encode_head(), deadline)
            self._send(request.payload, deadline)
            while True:
                reply = self._recv(deadline, MAX_REPLY)
                if "release" in reply.header:
                    held.close()
                elif "reserve" in reply.header:
                    self._send(self._grant(reply.header["reserve"], held, on_reserve), deadline)
                else:
                    self.answered += 1
                    return reply

    @staticmethod
    def _grant(size: object, held: ExitStack, on_reserve: OnReserve) -> bytes:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise WireError(f"a reserve of {size!r} bytes")
        try:
            on_reserve(size, held)
        except Exception as e:  # the budget's refusal, told to the child
            return Frame({"granted": False, "busy": str(e)}).encode()
        return Frame({"granted": True}).encode()

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            self._wait(self._in, select.POLLOUT, deadline)
            try:
                view = view[os.write(self._in, view) :]
            except BrokenPipeError:
                raise self._ended() from None

    def _recv(self, deadline: float, max_payload: int) -> Frame:
        def read_exactly(n: int) -> bytes:
            chunks, left = [], n
            while left:
                self._wait(self._out, select.POLLIN, deadline)
                chunk = os.read(self._out, min(left, 1 << 20))
                if not chunk:
                    raise self._ended()
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)

        return Frame.read(read_exactly, max_payload)

    def _wait(self, fd: int, event: int, deadline: float) -> None:
        poll = select.poll()
        poll.register(fd, event)
        left = deadline - time.monotonic()
        if left <= 0 or not poll.poll(left * 1000):
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
        if code == -signal.SIGKILL:
            return ParserFailed("ended the parser (killed: out of memory?)", limit=True)
        return ParserFailed(f"ended the parser (exit {code})", limit=False)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        shutil.rmtree(self.home, ignore_errors=True)

    def close(self) -> None:
        """Close its stdin, which ends it, then reap it."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        self.kill()


class ParserPool:
    """Up to `size` children of one kind: `call` hands a request to an idle one (starting
    one while fewer than `size` live), waiting up to `wait_s` for one to come free."""

    def __init__(self, name: str, size: int, limits: Limits, wait_s: float = 5.0) -> None:
        self.name, self.size, self.limits, self.wait_s = name, size, limits, wait_s
        self._idle: list[_Child] = []
        self._live = 0
        self._closed = False
        self._changed = threading.Condition()

    def warm(self, count: int = 1) -> None:
        """Start up to `count` children now, so that the first requests find them ready."""
        started = []
        for _ in range(min(count, self.size)):
            with self._changed:
                if self._live >= self.size:
                    break
                self._live += 1
            started.append(self._start())
        for child in started:
            self._give_back(child)

    def call(
        self,
        request: Frame,
        *,
        cpu_s: float | None = None,
        wall_s: float | None = None,
        on_reserve: OnReserve | None = None,
    ) -> Frame:
        """The child's answer; Refused for a refusal it made; ParserFailed if it ended or
        was ended first; PoolBusy if no child came free within wait_s."""
        limits = self.limits
        budget = Limits(
            limits.memory,
            limits.cpu_s if cpu_s is None else cpu_s,
            limits.wall_s if wall_s is None else wall_s,
        )
        child = self._take()
        child.budget = budget
        deadline = time.monotonic() + budget.wall_s
        request = Frame({**request.header, "cpu_s": budget.cpu_s}, request.payload)
        sound = False
        try:
            reply = child.exchange(request, deadline, on_reserve or _no_reserve)
            sound = not reply.header.get("retire") and child.answered < limits.requests
        except WireError as e:
            child.kill()
            raise ParserFailed(f"answered out of turn ({e})", limit=False) from e
        finally:
            self._return(child, sound)
        error = reply.header.get("error")
        if error is None:
            return reply
        if error == "MemoryError":
            raise ParserFailed(
                f"needs more than {limits.memory >> 20} MiB of memory to read", limit=True
            )
        if error == "Crash":
            log.warning("a %s parser failed: %s", self.name, reply.header.get("message"))
        raise Refused(str(error), str(reply.header.get("message", "")))

    def _take(self) -> _Child:
        with self._changed:
            if self._closed:
                raise PoolBusy(f"the {self.name} parsers are closed")
            ready = self._changed.wait_for(
                lambda: bool(self._idle) or self._live < self.size, self.wait_s
            )
            if not ready:
                raise PoolBusy(f"all {self.size} {self.name} parsers of this API process are busy")
            while self._idle:
                child = self._idle.pop()
                if child.proc.poll() is None:
                    return child
                child.kill()  # it died idle (killed, or its parent's signal): never handed work
                self._live -= 1
            self._live += 1
        return self._start()

    def _start(self) -> _Child:
        try:
            return _Child(self.limits)
        except BaseException:
            with self._changed:
                self._live -= 1
                self._changed.notify()
            raise

    def _return(self, child: _Child, sound: bool) -> None:
        if sound:
            self._give_back(child)
            return
        child.close() if child.proc.poll() is None else child.kill()
        with self._changed:
            self._live -= 1
            self._changed.notify()

    def _give_back(self, child: _Child) -> None:
        with self._changed:
            if not self._closed:
                self._idle.append(child)
                self._changed.notify()
                return
            self._live -= 1
        child.close()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
        for child in idle:
            child.close()


def _no_reserve(size: int, held: ExitStack) -> None:
    raise WireError(f"a reserve of {size} bytes, where this request has no budget")


class Parsers:
    """The API process's two pools: uploads (one child per upload slot, a CPU budget that
    grows with the upload's size) and predict's images (kept warm: a request pays a pipe's
    round trip, not a child's start)."""

    def __init__(self, settings: Settings) -> None:
        self.decode_budget = DecodeBudget(settings.max_decode_bytes)
        self.upload_pool = ParserPool(
            "upload",
            settings.max_parallel_uploads,
            Limits(settings.upload_parser_memory, settings.upload_parser_cpu_s,
                   wall_s(settings.upload_parser_cpu_s), requests=100),
        )  # fmt: skip
        self.upload_cpu_s_per_mib = settings.upload_parser_cpu_s_per_mib
        self.image_pool = ParserPool(
            "image",
            settings.predict_parsers,
            Limits(IMAGE_PARSER_MEMORY, IMAGE_CPU_S, IMAGE_WALL_S),
            wait_s=DECODE_WAIT_S,
        )

    def for_key(self, owner: str | None) -> KeyDecoder:
        """Predict's image files as `owner`'s request decodes them."""
        return KeyDecoder(self, self.decode_budget.for_key(owner))

    def warm(self) -> None:
        self.image_pool.warm(self.image_pool.size)
        self.upload_pool.warm(1)

    def close(self) -> None:
        self.upload_pool.close()
        self.image_pool.close()

    def upload(self, data: bytes, max_images: int, options: PhotoOptions) -> ParsedDataset:
        """api.uploads.parse_upload, in a child: InvalidDataset or DatasetTooLarge as it
        raises them, and DatasetTooLarge for an upload that overran a child's limit;
        PoolBusy if no child came free."""
        cpu_s = self.upload_pool.limits.cpu_s + len(data) / (1 << 20) * self.upload_cpu_s_per_mib
        request = Frame(
            {"op": "upload", "max_images": max_images, "options": dataclasses.asdict(options)},
            data,
        )  # fmt: skip
        try:
            reply = self.upload_pool.call(request, cpu_s=cpu_s, wall_s=wall_s(cpu_s))
        except ParserFailed as e:
            if e.limit:
                raise DatasetTooLarge(f"the upload {e.why}") from e
            raise InvalidDataset(f"the upload could not be read: it {e.why}") from e
        except Refused as e:
            raise _refusal(e, InvalidDataset) from e
        return _parsed(reply)

    def images(
        self,
        files: list[bytes],
        shape: tuple[int, int, int],
        invert: bool,
        budget: KeyBudget,
        fit: str | None,
    ) -> list[bytes | str]:
        """api.images.decode_image of each file, in a warm child that reserves `budget`
        through the pipe: each file's pixels, or why it was refused (a file that ended the
        child refuses the request's files together); DecodeBusy as decode_image raises it,
        or when every child is busy."""
        request = Frame(
            {"op": "images", "shape": list(shape), "invert": invert, "fit": fit,
             "sizes": [len(f) for f in files]},
            b"".join(files),
        )  # fmt: skip

        def reserve(size: int, held: ExitStack) -> None:
            held.enter_context(budget.reserve(size))

        wall_s = IMAGE_WALL_S + IMAGE_CPU_S * len(files)
        try:
            reply = self.image_pool.call(
                request, cpu_s=IMAGE_CPU_S * len(files), wall_s=wall_s, on_reserve=reserve
            )
        except ParserFailed as e:
            return [e.why] * len(files)
        except Refused as e:
            raise _refusal(e, ImageRejected) from e
        except PoolBusy as e:
            raise DecodeBusy(f"{e} decoding images (predict_parsers)") from e
        return _decoded(reply, len(files), shape)


@dataclass(frozen=True)
class KeyDecoder:
    """Parsers.images for one key's request, within that key's share of the decode budget."""

    parsers: Parsers
    budget: KeyBudget

    def decode(self, files: list[bytes], shape: tuple[int, int, int], invert: bool,
               fit: str | None) -> list[bytes | str]:  # fmt: skip
        return self.parsers.images(files, shape, invert, self.budget, fit)


_REFUSALS: dict[str, type[Exception]] = {
    "InvalidDataset": InvalidDataset,
    "DatasetTooLarge": DatasetTooLarge,
    "ImageRejected": ImageRejected,
    "DecodeBusy": DecodeBusy,
}


def _refusal(refused: Refused, otherwise: type[Exception]) -> Exception:
    """The child's refusal raised again as itself; a crash as `otherwise`."""
    message = refused.message[:MAX_MESSAGE]
    kind = _REFUSALS.get(refused.kind)
    if kind is None or not issubclass(kind, (otherwise, DecodeBusy)):
        return otherwise(f"could not be read ({message})")
    return kind(message)


_PARSED = TypeAdapter(ParsedDataset)


def _parsed(reply: Frame) -> ParsedDataset:
    """The child's data set, its fields checked as any input's are; its hash made here."""
    fields = reply.header.get("parsed")
    if not isinstance(fields, dict):
        raise InvalidDataset("the upload could not be read: the parser answered no data set")
    npz = reply.payload
    try:
        return _PARSED.validate_python(
            {**fields, "npz": npz, "sha256": hashlib.sha256(npz).hexdigest()}
        )
    except ValidationError as e:
        raise InvalidDataset(f"the upload could not be read: the parser answered {e}") from e


def _decoded(reply: Frame, count: int, shape: tuple[int, int, int]) -> list[bytes | str]:
    """The child's answer to an images request, cut into each file's pixels or refusal."""
    results = reply.header.get("results")
    c, h, w = shape
    size = c * h * w
    if not isinstance(results, list) or len(results) != count:
        return ["ended the parser (it answered out of turn)"] * count
    ok = sum(r is None for r in results)
    if len(reply.payload) != ok * size:
        return ["ended the parser (it answered out of turn)"] * count
    out: list[bytes | str] = []
    start = 0
    for r in results:
        if r is None:
            out.append(reply.payload[start : start + size])
            start += size
        else:
            out.append(str(r)[:MAX_MESSAGE])
    return out

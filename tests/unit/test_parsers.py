"""The parser children (api.parsers) hold their limits, and a child that overran one, died
or stopped costs that request alone: its pool hands the next request to a fresh child.
Real child processes, real files."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from api.images import DecodeBudget, DecodeBusy
from api.parser_pool import Bounds, Limits, ParserFailed, ParserPool
from api.parser_wire import Frame
from api.parsers import UPLOAD_REPLY, Parsers
from api.photo_sets import PhotoOptions
from core.config import Settings
from core.errors import InvalidDataset, Unavailable
from tests.memory import peak_growth_mib

SMALL = Limits(memory=1 << 30, cpu_s=5, wall_s=20)


def npz(n: int) -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    np.savez(buf, x_train=rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
             y_train=rng.integers(0, 10, n), x_test=rng.integers(0, 256, (n // 9, 28, 28),
             dtype=np.uint8), y_test=rng.integers(0, 10, n // 9))  # fmt: skip
    return buf.getvalue()


def png(side: int, mode: str = "L") -> bytes:
    img = Image.new(mode, (side, side))
    ImageDraw.Draw(img).rectangle((side // 4, side // 4, side // 2, side // 2), fill=255)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def decode(pool: ParserPool, files: list[bytes]) -> list[bytes | str]:
    parsers = Parsers(Settings())
    parsers.image_pool.close()
    parsers.image_pool = pool
    return parsers.images(files, (1, 28, 28), False, DecodeBudget(256 << 20).for_key("a"), None)


@pytest.fixture
def pool() -> Iterator[ParserPool]:
    p = ParserPool("test", 1, SMALL)
    yield p
    p.close()


def only_child(pool: ParserPool) -> int:
    pool.warm(1)
    [child] = pool._idle
    return child.proc.pid


def test_a_child_decodes_and_is_kept_warm_for_the_next_request(pool: ParserPool) -> None:
    pid = only_child(pool)
    first = decode(pool, [png(56)])
    assert isinstance(first[0], bytes) and len(first[0]) == 28 * 28
    assert decode(pool, [png(40), b"no image"])[1] == "not a PNG or JPEG image"
    assert only_child(pool) == pid  # a refusal on purpose leaves the child sound


def test_a_child_out_of_memory_costs_its_request_and_a_fresh_child_takes_the_next() -> None:
    """An .npz of 90,000 noise digits: some 80 MiB that a parse holds a few times over."""
    pool = ParserPool("test", 1, Limits(memory=384 << 20, cpu_s=60, wall_s=180))
    try:
        pid = only_child(pool)
        request = Frame({"op": "upload", "max_images": 200_000, "options": {}}, npz(90_000))
        with pytest.raises(ParserFailed, match="needs more than 384 MiB of memory to read"):
            pool.call(request, Bounds(UPLOAD_REPLY))
        assert isinstance(decode(pool, [png(28)])[0], bytes)
        assert only_child(pool) != pid
    finally:
        pool.close()


def test_a_stopped_child_is_killed_at_the_requests_deadline(pool: ParserPool) -> None:
    pid = only_child(pool)
    os.kill(pid, signal.SIGSTOP)
    request = Frame({"op": "images", "shape": [1, 28, 28], "invert": False, "sizes": [0]})
    with pytest.raises(ParserFailed, match=r"took over 1 s to read") as failed:
        pool.call(request, Bounds(28 * 28), wall_s=1)
    assert failed.value.limit
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert isinstance(decode(pool, [png(28)])[0], bytes)


def test_a_child_over_its_cpu_seconds_is_ended_by_the_kernel(pool: ParserPool) -> None:
    """Sixteen progressive JPEGs of noise: some 0.2 CPU seconds each, past a budget of 0.1
    (the kernel's limit is whole seconds: the child gets one more than its budget)."""
    noise = Image.frombytes("L", (1024, 1024), os.urandom(1 << 20)).resize((2800, 2800))
    buf = io.BytesIO()
    noise.convert("RGB").save(buf, format="JPEG", progressive=True, quality=95, subsampling=0)
    files = [buf.getvalue()] * 16
    request = Frame(
        {"op": "images", "shape": [1, 28, 28], "invert": False, "sizes": [len(f) for f in files]},
        b"".join(files),
    )
    with pytest.raises(ParserFailed, match=r"took over 0.1 CPU seconds") as failed:
        pool.call(
            request, Bounds(16 * 28 * 28, 32), cpu_s=0.1, wall_s=120,
            on_reserve=lambda size, held: None,
        )  # fmt: skip
    assert failed.value.limit


def test_a_child_killed_while_idle_is_never_handed_a_request(pool: ParserPool) -> None:
    pid = only_child(pool)
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    assert isinstance(decode(pool, [png(28)])[0], bytes)
    assert only_child(pool) != pid


def test_a_child_has_no_network_and_can_write_no_file(pool: ParserPool) -> None:
    pid = only_child(pool)
    [child] = pool._idle
    assert child.network in ("namespace", "sockets refused")
    if child.network == "namespace":
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    # Nowhere to write, so nothing to leave behind however the API ends.
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    limits = Path(f"/proc/{pid}/limits").read_text()
    assert re.search(r"Max file size\s+0\s+0 ", limits), limits
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"TMPDIR=/dev/null/trainq-parser" in environ


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped"])
def test_a_child_ends_with_the_process_that_started_it(stopped: bool) -> None:
    """The API killed with -9 (its children stopped or not, started from a request's thread
    that has ended since): its children are not left behind."""
    script = (
        "import sys, threading;from api.parser_pool import ParserPool, Limits;"
        "p=ParserPool('t',1,Limits(1<<30,5,20));"
        "t=threading.Thread(target=p.warm);t.start();t.join();"
        "print(p._idle[0].proc.pid,flush=True);sys.stdin.read()"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as parent:  # fmt: skip
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        if stopped:
            os.kill(pid, signal.SIGSTOP)
        parent.kill()
    for _ in range(300):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists()


def test_a_child_killed_from_outside_mid_request_is_a_503_to_retry() -> None:
    parsers = Parsers(Settings(predict_parsers=1))
    try:
        parsers.warm()
        [child] = parsers.image_pool._idle
        files = [slow_jpeg()] * 16  # seconds of decoding
        threading.Timer(1.0, os.kill, (child.proc.pid, signal.SIGKILL)).start()
        with pytest.raises(Unavailable, match=r"was killed \(out of memory on this host\?\)"):
            parsers.for_key("a").decode(files, (1, 28, 28), False, None)
        assert isinstance(
            parsers.for_key("a").decode([png(28)], (1, 28, 28), False, None)[0], bytes
        )
    finally:
        parsers.close()


# ---------------------------------------------------------------------------- a child gone bad


def hostile(*how: str) -> ParserPool:
    return ParserPool("test", 1, SMALL, command=("-P", "-m", "tests.hostile_parser_child", *how))


def images_with(pool: ParserPool, files: int = 2) -> list[bytes | str]:
    return decode(pool, [png(28)] * files)


def test_a_huge_answer_is_refused_from_its_length_before_it_is_read() -> None:
    pool = hostile("huge")
    try:
        _, growth = peak_growth_mib(os.getpid(), lambda: images_with(pool))
        assert images_with(pool)[0].startswith("ended the parser (it answered out of turn")  # type: ignore[union-attr]
        assert growth < 64, f"a 1 GiB answer to 2 files raised this process's peak by {growth} MiB"
    finally:
        pool.close()


@pytest.mark.parametrize(
    "how", [("nested",), ("refusal", "ImageRejected"), ("refusal", "InvalidDataset"), ("releases",)]
)
def test_an_answer_out_of_turn_refuses_the_files_and_raises_nothing(how: tuple[str, ...]) -> None:
    pool = hostile(*how)
    try:
        answers = images_with(pool)
        assert all(isinstance(a, str) for a in answers), answers
    finally:
        pool.close()


@pytest.mark.parametrize("how", ["nan", "no_classes"])
def test_a_data_set_answer_is_checked_as_an_input_is(how: str) -> None:
    parsers = Parsers(Settings())
    parsers.upload_pool.close()
    parsers.upload_pool = hostile(how)
    try:
        with pytest.raises(InvalidDataset, match="the parser answered 1 fields that do not"):
            parsers.upload(b"anything", 100, PhotoOptions())
    finally:
        parsers.close()


def test_one_key_holds_at_most_half_of_the_image_children() -> None:
    """Alice's two slow requests at once (progressive JPEGs, a few CPU seconds each) hold
    one child; her second waits and is refused (503), while Bob's request is decoded."""
    parsers = Parsers(Settings(predict_parsers=2))
    parsers.image_pool.wait_s = 1.0
    slow = [slow_jpeg()] * 16
    try:
        parsers.warm()
        alice, bob = parsers.for_key("alice"), parsers.for_key("bob")
        with ThreadPoolExecutor(2) as threads:
            first = threads.submit(alice.decode, slow, (1, 28, 28), False, None)
            time.sleep(0.3)
            second = threads.submit(alice.decode, [png(28)], (1, 28, 28), False, None)
            theirs = bob.decode([png(28)], (1, 28, 28), False, None)
            with pytest.raises(DecodeBusy, match="this key holds 1 of the 2 image parsers"):
                second.result()
            assert all(isinstance(a, bytes) for a in first.result())
        assert isinstance(theirs[0], bytes)
    finally:
        parsers.close()


def test_a_thousand_classes_of_thumbnails_come_back_whole() -> None:
    """The thumbnails travel beside the .npz, not in a header: 300 classes of 32×32 photos."""
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for k in range(300):
            for i in range(3):
                img = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
                out = io.BytesIO()
                img.save(out, "PNG")
                zf.writestr(f"c{k}/{i}.png", out.getvalue())
    parsers = Parsers(Settings())
    try:
        parsed = parsers.upload(buf.getvalue(), 10_000, PhotoOptions(val_fraction=0.34))
    finally:
        parsers.close()
    assert parsed.num_classes == 300 and parsed.thumbnails is not None
    assert len(parsed.thumbnails) == 300
    first = base64.b64decode(parsed.thumbnails[0][0])
    assert Image.open(io.BytesIO(first)).size == (32, 32)
    assert hashlib.sha256(parsed.npz).hexdigest() == parsed.sha256


def slow_jpeg() -> bytes:
    noise = Image.frombytes("L", (1024, 1024), os.urandom(1 << 20)).resize((2800, 2800))
    buf = io.BytesIO()
    noise.convert("RGB").save(buf, format="JPEG", progressive=True, quality=95, subsampling=0)
    return buf.getvalue()

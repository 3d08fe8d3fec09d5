"""Each exported format loaded as a callable from images to logits, and the check of a
model's formats in a fresh process.

`python -P core/train/verify_export.py --serve=FD` (run by its path, with -P: nothing of
trainq is importable) imports torch, and what loading the formats takes (onnxruntime,
torch.export's loader), and nothing else: none of the trainer, the API or the database.
It never runs a model itself. Each message on the socket FD (core.train.checker) carries
one end of a new connection; it forks a child for each, which shares nothing with the
trainer that asks and nothing with any other check, reads what to check from the
connection, answers, and exits (at once, if the trainer closes its end first). What comes:
one line of JSON, {"shape": [N, C, H, W], "classes": K, "formats": {format: bytes, ...},
"metadata": {key: text}, "timeout_s": T}, then the images (N·C·H·W float32), the trained
model's logits on them (N·K float32) and each format's bytes, in that order. The answer is
one JSON object: per format, the largest absolute difference of its logits from the
expected ones, or why it failed (its metadata, read back as a user would, must hold the
expected entries), and the seconds the check took.
See docs/api.md ("Model formats")."""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import math
import os
import select
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import IO, Any

import torch

# As core/__init__.py (not imported here): no onnxruntime telemetry, and no database of its
# own held open across the forks of each check.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

FORMATS = ("torchscript", "pt2", "onnx")  # core.spec.ExportFormat, which this cannot import
# What each format's metadata holds (core.train.model_card): JSON texts.
METADATA_KEYS = ("classes", "preprocessing")
Model = Callable[[torch.Tensor], torch.Tensor]


def load_model(fmt: str, blob: bytes, *, threads: int | None = None) -> Model:
    """The model in `blob` on the CPU: float images (N, C, H, W) in [0, 1] to logits (N, K).
    `threads` bounds onnxruntime's intra-op threads (torch's are process-wide)."""
    if fmt == "torchscript":
        return load_torchscript(blob)
    if fmt == "pt2":
        module: Model = torch.export.load(io.BytesIO(blob)).module()
        return module
    if fmt == "onnx":
        return OnnxModel(blob, threads)
    raise ValueError(f"unknown model format {fmt!r}")


def load_torchscript(
    blob: bytes, device: str = "cpu", extra_files: dict[str, Any] | None = None
) -> torch.jit.ScriptModule:
    """`extra_files`: names to read from the file, filled in as it loads."""
    # TorchScript is deprecated upstream (torch >= 2.10) but still what users load most.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")
        module: torch.jit.ScriptModule = torch.jit.load(
            io.BytesIO(blob), map_location=device, _extra_files=extra_files or {}
        )
        return module.eval()


def read_metadata(fmt: str, blob: bytes) -> dict[str, str]:
    """The METADATA_KEYS entries a model file carries, read with each format's own loader
    (TorchScript `_extra_files`, torch.export `extra_files`, ONNX `metadata_props`); a
    missing entry is left out."""
    return load_with_metadata(fmt, blob)[1]


def load_with_metadata(fmt: str, blob: bytes) -> tuple[Model, dict[str, str]]:
    """The model in `blob` (as load_model) and its metadata (as read_metadata), loaded once."""
    found: dict[str, Any] = dict.fromkeys(METADATA_KEYS, "")
    model: Model
    if fmt == "onnx":
        onnx = OnnxModel(blob, torch.get_num_threads())
        found = onnx.session.get_modelmeta().custom_metadata_map
        model = onnx
    elif fmt == "torchscript":
        model = load_torchscript(blob, extra_files=found)
    elif fmt == "pt2":
        model = torch.export.load(io.BytesIO(blob), extra_files=found).module()
    else:
        raise ValueError(f"unknown model format {fmt!r}")
    return model, {k: _text(found[k]) for k in METADATA_KEYS if found.get(k)}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class OnnxModel:
    """An onnxruntime CPU session that takes and returns torch tensors."""

    def __init__(self, blob: bytes, threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            blob, sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.input = self.session.get_inputs()[0].name

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        images = x.detach().to("cpu", torch.float32).contiguous().numpy()
        return torch.from_numpy(self.session.run(None, {self.input: images})[0])


def check(model: Model, x: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest absolute difference from `expected`, over the whole batch and over its
    first image alone (a batch of one: the batch dimension is dynamic)."""
    with torch.inference_mode():
        got = model(x)
        one = model(x[:1])
    if got.shape != expected.shape or one.shape != expected[:1].shape:
        raise ValueError(f"logits of shape {list(got.shape)}, not {list(expected.shape)}")
    worst = max((got - expected).abs().max().item(), (one - expected[:1]).abs().max().item())
    if not math.isfinite(worst):
        raise ValueError("logits that are not finite")
    return worst


def as_bytes(t: torch.Tensor) -> bytes:
    """A tensor's values as float32, as a check reads them."""
    return t.detach().to(torch.float32).contiguous().numpy().tobytes()


def encode(
    x: torch.Tensor,
    expected: torch.Tensor,
    blobs: dict[str, bytes],
    metadata: dict[str, str] | None = None,
    timeout_s: float = 120.0,
) -> bytes:
    """What a check reads from its connection (see the module's docstring)."""
    arrays = (as_bytes(x), as_bytes(expected))
    return b"".join(encode_parts(list(x.shape), arrays, blobs, metadata, timeout_s))


def encode_parts(
    shape: list[int],
    arrays: tuple[bytes, bytes],
    blobs: dict[str, bytes],
    metadata: dict[str, str] | None,
    timeout_s: float,
) -> list[bytes]:
    """encode's pieces, sent one after another: the images and logits (as_bytes of each,
    made once for all of a model's checks) are not copied again into one message."""
    header = {
        "shape": shape,
        "classes": len(arrays[1]) // (4 * shape[0]),
        "formats": {fmt: len(blob) for fmt, blob in blobs.items()},
        "metadata": metadata or {},
        "timeout_s": timeout_s,
    }
    return [json.dumps(header).encode() + b"\n", *arrays, *blobs.values()]


def decode(
    stream: IO[bytes],
) -> tuple[torch.Tensor, torch.Tensor, dict[str, bytes], dict[str, str], float]:
    header = json.loads(stream.readline())
    shape = [int(n) for n in header["shape"]]
    classes = int(header["classes"])

    def read(size: int) -> bytes:
        data = stream.read(size)
        if len(data) != size:
            raise ValueError(f"what to check ended after {len(data)} of {size} bytes")
        return data

    def floats(count: int, shape: list[int]) -> torch.Tensor:
        buf = bytearray(4 * count)  # read straight into the tensor's memory: one copy
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = stream.readinto(view[got:])  # type: ignore[attr-defined]
            if not n:
                raise ValueError(f"what to check ended after {got} of {len(buf)} bytes")
            got += n
        return torch.frombuffer(buf, dtype=torch.float32).view(shape)

    x = floats(math.prod(shape), shape)
    expected = floats(shape[0] * classes, [shape[0], classes])
    blobs = {str(fmt): read(int(size)) for fmt, size in header["formats"].items()}
    metadata = {str(k): str(v) for k, v in header.get("metadata", {}).items()}
    return x, expected, blobs, metadata, float(header.get("timeout_s", 120.0))


def check_all(
    x: torch.Tensor,
    expected: torch.Tensor,
    blobs: dict[str, bytes],
    metadata: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    report: dict[str, dict[str, Any]] = {}
    for fmt in FORMATS:
        if fmt not in blobs:
            continue
        started = time.perf_counter()
        try:
            model, found = load_with_metadata(fmt, blobs[fmt])
            check_metadata(found, metadata or {})
            report[fmt] = {"max_abs_diff": check(model, x, expected)}
        except Exception as e:  # any way a format fails is reported, not raised
            report[fmt] = {"error": f"{type(e).__name__}: {e}"[:500]}
        report[fmt]["check_s"] = round(time.perf_counter() - started, 3)
    return report


def check_metadata(found: dict[str, str], expected: dict[str, str]) -> None:
    """ValueError unless the model carries each expected entry, unchanged."""
    for key, value in expected.items():
        if key not in found:
            raise ValueError(f"its metadata has no {key!r}")
        if found[key] != value:
            raise ValueError(f"its metadata's {key!r} is not the one exported")


def die_with(parent: int) -> None:
    """SIGKILL this process when `parent` dies (Linux's PR_SET_PDEATHSIG; elsewhere the
    closed socket ends it), and exit now if it died already."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(3)


def warm_up() -> None:
    """What the first load of each format imports and builds, done once here so that no
    check pays it: a two-weight program exported, saved and loaded again. Fake tensors and
    tensors of one element (too small for any op to go parallel), and torch's thread count
    left unset: nothing makes a thread pool that a fork would lose or remake racing (each
    check sets the count first, on its one thread)."""
    import onnxruntime  # noqa: F401

    program = torch.export.export(torch.nn.Linear(1, 1), (torch.zeros(1, 1),))
    buf = io.BytesIO()
    torch.export.save(program, buf, extra_files={"warm": "up"})
    torch.export.load(io.BytesIO(buf.getvalue()), extra_files={"warm": ""})


def serve(control: socket.socket) -> None:
    """Fork a check for each connection that comes on `control`, until every process that
    could send one has closed it. Children are reaped by the kernel (SIGCHLD ignored)."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    me = os.getpid()
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(control, 16, 8)
        except ConnectionError:
            return
        if not message and not fds:
            return  # end of file
        for fd in fds:
            if os.fork() == 0:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                control.close()
                die_with(me)
                os._exit(answer(socket.socket(fileno=fd)))
            os.close(fd)


def end_with_asker(conn: socket.socket) -> None:
    """Exit as soon as the process that asked closes its end of `conn` (a cancelled job, a
    killed work horse): nobody reads the answer, and the check would hold cores and memory
    while the worker's next job runs. Its end only shut for writing is not closed."""

    def watch() -> None:
        hangup = select.poll()
        hangup.register(conn.fileno(), 0)  # POLLHUP is reported whatever is asked for
        hangup.poll()  # or POLLNVAL, once the answer is written and `conn` closed
        os._exit(4)

    threading.Thread(target=watch, daemon=True).start()


def answer(conn: socket.socket) -> int:
    """One check: what to check read from `conn`, the report written back. An exit status."""
    with conn:
        try:
            stream = conn.makefile("rb")
            x, expected, blobs, metadata, timeout_s = decode(stream)
            signal.alarm(max(1, math.ceil(timeout_s)))  # nobody waits for it after that
            end_with_asker(conn)
            # Half the cores: the trainer exports the next format meanwhile.
            torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
            report = check_all(x, expected, blobs, metadata)
            for entry in report.values():
                entry["pid"] = os.getpid()  # a process of its own: the asker can tell
            conn.sendall(json.dumps(report).encode())
        except Exception as e:  # the asker sees no answer, and says the check failed
            print(f"verify_export: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    return 0


def main(args: list[str]) -> None:
    parents = [a for a in args if a.startswith("--parent=")]
    if parents:
        die_with(int(parents[0].removeprefix("--parent=")))
    control = [a for a in args if a.startswith("--serve=")]
    if not control:
        sys.exit("usage: verify_export.py --serve=FD [--parent=PID]")
    warm_up()
    serve(socket.socket(fileno=int(control[0].removeprefix("--serve="))))


if __name__ == "__main__":
    main(sys.argv[1:])

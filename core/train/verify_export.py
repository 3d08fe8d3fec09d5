"""Each exported format loaded as a callable from images to logits, and the check of a
model's formats in a fresh process.

`python -P core/train/verify_export.py FORMAT...` (run by its path, with -P: nothing of
trainq is importable) imports torch, and what loading those formats takes (onnxruntime for
onnx), and nothing else: none of the trainer, the API or the database. What it checks
comes on stdin (no file anywhere: nothing to leave behind, no disk to fill): one line of
JSON, {"shape": [N, C, H, W], "classes": K, "formats": {format: bytes, ...}, "metadata":
{key: text}}, then the images (N·C·H·W float32), the trained model's logits on them (N·K
float32) and each format's bytes, in that order. It prints one JSON object: per format, the
largest absolute difference of its logits from the expected ones, or why it failed (its
metadata, read back as a user would, must hold the expected entries).
See docs/api.md ("Model formats")."""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import math
import os
import signal
import sys
import warnings
from collections.abc import Callable
from typing import IO, Any, cast

import torch

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


def load_torchscript(blob: bytes, device: str = "cpu") -> torch.jit.ScriptModule:
    # TorchScript is deprecated upstream (torch >= 2.10) but still what users load most.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")
        module: torch.jit.ScriptModule = torch.jit.load(io.BytesIO(blob), map_location=device)
        return module.eval()


def read_metadata(fmt: str, blob: bytes) -> dict[str, str]:
    """The METADATA_KEYS entries a model file carries, read with each format's own loader
    (TorchScript `_extra_files`, torch.export `extra_files`, ONNX `metadata_props`); a
    missing entry is left out."""
    if fmt == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
        found = session.get_modelmeta().custom_metadata_map
    else:
        found = dict.fromkeys(METADATA_KEYS, "")
        if fmt == "torchscript":
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")
                torch.jit.load(io.BytesIO(blob), map_location="cpu", _extra_files=found)
        else:
            torch.export.load(io.BytesIO(blob), extra_files=found)
    return {k: _text(found[k]) for k in METADATA_KEYS if found.get(k)}


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


def encode(
    x: torch.Tensor,
    expected: torch.Tensor,
    blobs: dict[str, bytes],
    metadata: dict[str, str] | None = None,
) -> bytes:
    """What the checking process reads on stdin (see the module's docstring)."""
    header = {
        "shape": list(x.shape),
        "classes": expected.shape[1],
        "formats": {fmt: len(blob) for fmt, blob in blobs.items()},
        "metadata": metadata or {},
    }
    return b"".join(
        [
            json.dumps(header).encode() + b"\n",
            x.detach().to(torch.float32).contiguous().numpy().tobytes(),
            expected.detach().to(torch.float32).contiguous().numpy().tobytes(),
            *blobs.values(),
        ]
    )


def decode(
    stream: IO[bytes],
) -> tuple[torch.Tensor, torch.Tensor, dict[str, bytes], dict[str, str]]:
    header = json.loads(stream.readline())
    shape = [int(n) for n in header["shape"]]
    classes = int(header["classes"])

    def read(size: int) -> bytes:
        data = stream.read(size)
        if len(data) != size:
            raise ValueError(f"stdin ended after {len(data)} of {size} bytes")
        return data

    def floats(count: int, shape: list[int]) -> torch.Tensor:
        return torch.frombuffer(bytearray(read(4 * count)), dtype=torch.float32).view(shape)

    x = floats(math.prod(shape), shape)
    expected = floats(shape[0] * classes, [shape[0], classes])
    blobs = {str(fmt): read(int(size)) for fmt, size in header["formats"].items()}
    metadata = {str(k): str(v) for k, v in header.get("metadata", {}).items()}
    return x, expected, blobs, metadata


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
        try:
            check_metadata(read_metadata(fmt, blobs[fmt]), metadata or {})
            report[fmt] = {"max_abs_diff": check(load_model(fmt, blobs[fmt]), x, expected)}
        except Exception as e:  # any way a format fails is reported, not raised
            report[fmt] = {"error": f"{type(e).__name__}: {e}"[:500]}
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
    closed stdin ends it), and exit now if it died already."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit(3)


def main(args: list[str]) -> None:
    # Started before the exports it checks: what loading the formats to come imports is
    # imported while they run. Then what to check comes on stdin.
    parents = [a for a in args if a.startswith("--parent=")]
    if parents:
        die_with(int(parents[0].removeprefix("--parent=")))
    formats = [a for a in args if a not in parents]
    if "pt2" in formats:
        import torch._export.serde.serialize  # noqa: F401
    if "onnx" in formats:
        import onnxruntime  # noqa: F401
    stream = cast(io.BufferedReader, sys.stdin.buffer)
    if stream.peek(1)[:1] in (b"", b"\n"):  # nothing to check
        print("{}")
        return
    print(json.dumps(check_all(*decode(stream))))


if __name__ == "__main__":
    main(sys.argv[1:])

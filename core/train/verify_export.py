"""Each exported format loaded as a callable from images to logits, and the check of a
model's formats in a fresh process.

`python -P core/train/verify_export.py FORMAT...` (run by its path, with -P: nothing of
trainq is importable) imports torch, and what loading those formats takes (onnxruntime for
onnx), and nothing else: none of the trainer, the API or the database. It reads the path of
a folder from stdin; the folder holds `input.pt` (float images), `expected.pt` (the trained
model's logits on them) and one file per format to check, named after the format. It
prints one JSON object: per format, the largest absolute difference of its logits from the
expected ones, or why it failed.
"""

from __future__ import annotations

import io
import json
import math
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

FORMATS = ("torchscript", "pt2", "onnx")  # core.spec.ExportFormat, which this cannot import
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


def check_folder(folder: Path) -> dict[str, dict[str, Any]]:
    x = torch.load(folder / "input.pt")
    expected = torch.load(folder / "expected.pt")
    report: dict[str, dict[str, Any]] = {}
    for fmt in FORMATS:
        path = folder / fmt
        if not path.exists():
            continue
        try:
            report[fmt] = {"max_abs_diff": check(load_model(fmt, path.read_bytes()), x, expected)}
        except Exception as e:  # any way a format fails is reported, not raised
            report[fmt] = {"error": f"{type(e).__name__}: {e}"[:500]}
    return report


def main(formats: list[str]) -> None:
    # Started before the exports it checks: what loading the formats to come imports is
    # imported while they run. Then the folder to check comes on stdin.
    if "pt2" in formats:
        import torch._export.serde.serialize  # noqa: F401
    if "onnx" in formats:
        import onnxruntime  # noqa: F401
    folder = sys.stdin.readline().strip()
    print(json.dumps(check_folder(Path(folder)) if folder else {}))


if __name__ == "__main__":
    main(sys.argv[1:])

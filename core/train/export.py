"""TorchScript export, verified by reload before anything is returned."""

from __future__ import annotations

import copy
import hashlib
import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from core.errors import ExportMismatch
from core.train.data import Dataset
from core.train.model import Net, Normalized


def export_torchscript(model: Net, data: Dataset, check_images: int = 256) -> tuple[bytes, str]:
    """Trace an fp32 CPU copy of the eval model (portable: load it anywhere, then `.to()`),
    wrapped so it takes images as floats in [0, 1]. Returns (bytes, sha256)."""
    net = copy.deepcopy(model).float().cpu().to(memory_format=torch.contiguous_format).eval()
    net.gradient_checkpointing = False
    wrapped = Normalized(net, data.mean, data.std).eval()
    x = data.test.images[:check_images].float().div(255)  # real held-out images
    with torch.inference_mode():
        expected = wrapped(x)
    with _torchscript_quiet():
        traced = torch.jit.trace(wrapped, x[:8], check_trace=False)
        buf = io.BytesIO()
        torch.jit.save(traced, buf)
    blob = buf.getvalue()
    verify_torchscript(blob, x, expected)
    return blob, hashlib.sha256(blob).hexdigest()


def verify_torchscript(blob: bytes, x: torch.Tensor, expected: torch.Tensor) -> None:
    loaded = load_torchscript(blob)
    with torch.inference_mode():
        got = loaded(x)
    if not torch.allclose(got, expected, rtol=1e-4, atol=1e-4):
        worst = (got - expected).abs().max().item()
        raise ExportMismatch(f"reloaded TorchScript logits differ by up to {worst:.3g}")


def load_torchscript(blob: bytes, device: str = "cpu") -> torch.jit.ScriptModule:
    with _torchscript_quiet():
        module: torch.jit.ScriptModule = torch.jit.load(io.BytesIO(blob), map_location=device)
        return module.eval()


@contextmanager
def _torchscript_quiet() -> Iterator[None]:
    """TorchScript is what users asked for (it loads without Python source); torch >= 2.10
    marks it deprecated in favour of torch.export, which we will add beside it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")
        yield

"""The trained model in the formats a job asks for (TorchScript, torch.export's .pt2, ONNX),
each checked in a fresh process against the trained model's logits before it is offered.

Every format is made from the same fp32 CPU copy of the eval model (portable: load it
anywhere, then `.to()`), wrapped so that it takes images as floats in [0, 1]. A format that
fails its export or its check is not offered, and the report says why; TorchScript, when
asked, must pass (ExportMismatch otherwise), and so must at least one format.
See docs/api.md ("Model formats")."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.errors import ExportCheckUnavailable, ExportMismatch
from core.spec import ExportFormat
from core.train import verify_export
from core.train.data import Dataset
from core.train.device import is_out_of_memory
from core.train.metrics import ExportedModel
from core.train.model import Net, Normalized
from core.train.model_card import model_metadata

VERIFIER = Path(__file__).with_name("verify_export.py")
VERIFY_TIMEOUT_S = 120.0  # Settings.export_check_timeout_s; progress is reported while it runs
MAX_BATCH = 65536  # JobSpec's largest batch_size


def tolerance(expected: torch.Tensor) -> float:
    """How far a format's logits may be from the trained model's: fp32 rounding, relative
    to the logits' size (the old in-process check's rtol=1e-4, atol=1e-4)."""
    return 1e-4 * (1 + expected.abs().max().item())


@dataclass
class Exports:
    models: dict[ExportFormat, ExportedModel]  # the formats that passed: what the job offers
    report: dict[str, dict[str, Any]]  # per asked format: its figures, or why it is not offered
    seconds: float  # export and check of all of them


def export_models(
    model: nn.Module,
    data: Dataset,
    formats: Sequence[ExportFormat],
    progress: Callable[[], None] = lambda: None,
    check_images: int = 256,
    check_timeout_s: float = VERIFY_TIMEOUT_S,
) -> Exports:
    """`formats` of the trained `model`, each checked on real held-out images, and each
    carrying the class names and preprocessing (core.train.model_card) in its metadata."""
    started = time.perf_counter()
    wrapped = _portable(model, data)
    x = data.test.images[:check_images].float().div(255)  # real held-out images
    meta = model_metadata(data)
    with torch.inference_mode():
        expected = wrapped(x)
    with fresh_checker(formats) as checker:
        blobs, report = _export_each(wrapped, x, formats, meta, progress)
        checked = check_in_fresh_process(
            checker, blobs, x, expected, meta, timeout_s=check_timeout_s, progress=progress
        )
    progress()
    models = _offered(blobs, checked, tolerance(expected), report)
    _required(formats, models, report)
    return Exports(models, report, time.perf_counter() - started)


def _export_each(
    wrapped: Normalized,
    x: torch.Tensor,
    formats: Sequence[ExportFormat],
    meta: dict[str, str],
    progress: Callable[[], None],
) -> tuple[dict[ExportFormat, bytes], dict[str, dict[str, Any]]]:
    """Each format's bytes, and the report of each: its export time or why it failed."""
    blobs: dict[ExportFormat, bytes] = {}
    report: dict[str, dict[str, Any]] = {}
    exported: torch.export.ExportedProgram | None = None  # pt2's, which ONNX starts from
    for fmt in formats:
        t0 = time.perf_counter()
        try:
            if fmt is ExportFormat.torchscript:
                blobs[fmt] = _torchscript(wrapped, x, meta)
            else:
                if exported is None:
                    exported = _exported_program(wrapped, x)
                pt2 = fmt is ExportFormat.pt2
                blobs[fmt] = _pt2(exported, meta) if pt2 else _onnx(exported, x, meta)
        except Exception as e:
            if is_out_of_memory(e):
                raise
            report[fmt] = {"ok": False, "error": f"export failed: {type(e).__name__}: {e}"[:500]}
        else:
            report[fmt] = {"export_s": round(time.perf_counter() - t0, 3)}
        progress()
    return blobs, report


def _portable(model: nn.Module, data: Dataset) -> Normalized:
    net = copy.deepcopy(model).float().cpu().to(memory_format=torch.contiguous_format).eval()
    if isinstance(net, Net):
        net.gradient_checkpointing = False
    return Normalized(net, data.mean, data.std).eval()


def _exported_program(wrapped: Normalized, x: torch.Tensor) -> torch.export.ExportedProgram:
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    return torch.export.export(wrapped, (x,), dynamic_shapes=({0: batch},))


def _torchscript(wrapped: Normalized, x: torch.Tensor, meta: dict[str, str]) -> bytes:
    with _torchscript_quiet():
        traced = torch.jit.trace(wrapped, x[:8], check_trace=False)
        buf = io.BytesIO()
        torch.jit.save(traced, buf, _extra_files=meta)
    return buf.getvalue()


def _pt2(exported: torch.export.ExportedProgram, meta: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    torch.export.save(exported, buf, extra_files=meta)
    return buf.getvalue()


def _onnx(exported: torch.export.ExportedProgram, x: torch.Tensor, meta: dict[str, str]) -> bytes:
    # From the ExportedProgram already made (its dynamic batch included): a third of the
    # time of exporting the module again. The opset is the exporter's default.
    program = torch.onnx.export(exported, (x,), dynamo=True, verbose=False)
    assert program is not None  # dynamo=True always returns the program
    proto = program.model_proto
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    blob: bytes = proto.SerializeToString()
    return blob


@contextmanager
def fresh_checker(formats: Sequence[ExportFormat]) -> Iterator[subprocess.Popen[bytes]]:
    """A new Python process that will check the formats (core.train.verify_export): what a
    user who downloads them does. Started before the exports, so that its imports (torch's
    seconds) overlap them; it waits for what to check on its stdin. It dies with the
    process that started it (a worker killed with -9 leaves no checker behind)."""
    proc = subprocess.Popen(
        [sys.executable, "-P", str(VERIFIER), f"--parent={os.getpid()}", *formats],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:  # the export failed before the check
            proc.kill()
            proc.communicate()


def check_in_fresh_process(
    checker: subprocess.Popen[bytes],
    blobs: dict[ExportFormat, bytes],
    x: torch.Tensor,
    expected: torch.Tensor,
    meta: dict[str, str] | None = None,
    *,
    timeout_s: float = VERIFY_TIMEOUT_S,
    progress: Callable[[], None] = lambda: None,
) -> dict[str, dict[str, Any]]:
    """Each blob loaded and run by `checker` on `x`, and its metadata read back and compared
    with `meta`. Per format: max_abs_diff, or error.
    Everything goes over the pipe: no temporary file. While it waits, `progress` is called
    every few seconds (the worker's heartbeat sees a live attempt). A checker that cannot
    answer (killed, out of time, unreadable output) is ExportCheckUnavailable: not the
    model's fault, and the job is retried rather than failed as a mismatch."""
    data = verify_export.encode(x, expected, {f.value: b for f, b in blobs.items()}, meta)
    answer: list[tuple[bytes, bytes]] = []
    # communicate() in a thread: one call with a timeout and a retry would drop the input
    # not yet written (CPython sends input only on the first call).
    talk = threading.Thread(target=lambda: answer.append(checker.communicate(data)), daemon=True)
    talk.start()
    deadline = time.monotonic() + timeout_s
    while talk.is_alive():
        talk.join(timeout=min(5.0, max(deadline - time.monotonic(), 0.01)))
        if talk.is_alive():
            progress()
            if time.monotonic() >= deadline:
                checker.kill()
                talk.join()
                raise ExportCheckUnavailable(
                    f"the fresh process checking the model's formats did not finish in "
                    f"{timeout_s:.0f} s"
                )
    if not answer:
        raise ExportCheckUnavailable("the fresh process checking the model's formats failed")
    out, err = answer[0]
    if checker.returncode != 0:
        tail = err.decode(errors="replace").strip()[-300:]
        raise ExportCheckUnavailable(
            f"the fresh process checking the model's formats exited {checker.returncode}: {tail}"
        )
    try:
        checked: dict[str, dict[str, Any]] = json.loads(out)
    except ValueError as e:
        raise ExportCheckUnavailable(
            f"the fresh process checking the model's formats answered no JSON ({e})"
        ) from e
    return checked


def _offered(
    blobs: dict[ExportFormat, bytes],
    checked: dict[str, dict[str, Any]],
    tol: float,
    report: dict[str, dict[str, Any]],
) -> dict[ExportFormat, ExportedModel]:
    """The formats whose logits matched; `report` says of each what it measured or why not."""
    models = {}
    for fmt, blob in blobs.items():
        result = checked.get(fmt, {"error": "the check did not report it"})
        entry = report[fmt]
        if "error" in result:
            entry.update(ok=False, error=f"check failed: {result['error']}")
            continue
        diff = result["max_abs_diff"]
        entry["max_abs_diff"] = diff
        if diff > tol:
            entry.update(
                ok=False, error=f"logits differ from the trained model's by up to {diff:.3g}"
            )
            continue
        sha = hashlib.sha256(blob).hexdigest()
        entry.update(ok=True, sha256=sha, size=len(blob))
        models[fmt] = ExportedModel(format=fmt, data=blob, sha256=sha)
    return models


def _required(
    formats: Sequence[ExportFormat],
    models: dict[ExportFormat, ExportedModel],
    report: dict[str, dict[str, Any]],
) -> None:
    if ExportFormat.torchscript in formats and ExportFormat.torchscript not in models:
        raise ExportMismatch(f"TorchScript: {report[ExportFormat.torchscript]['error']}")
    if not models:
        why = "; ".join(f"{fmt}: {report[fmt]['error']}" for fmt in formats)
        raise ExportMismatch(f"no format passed its check ({why})")


@contextmanager
def _torchscript_quiet() -> Iterator[None]:
    """torch >= 2.10 marks TorchScript deprecated in favour of torch.export; users still
    ask for it (it loads without Python source), so it stays the default download."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")
        yield

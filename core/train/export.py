"""The trained model in the formats a job asks for (TorchScript, torch.export's .pt2, ONNX),
each checked in a fresh process (core.train.checker) against the trained model's logits
before it is offered; each format's check runs while the next one exports.

Every format is made from the same fp32 CPU copy of the eval model (portable: load it
anywhere, then `.to()`), wrapped so that it takes images as floats in [0, 1]. A format that
fails its export or its check is not offered, and the report says why; TorchScript, when
asked, must pass (ExportMismatch otherwise), and so must at least one format.
See docs/api.md ("Model formats")."""

from __future__ import annotations

import copy
import functools
import hashlib
import io
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.onnx._constants import ONNX_DEFAULT_OPSET

from core.errors import ExportCheckUnavailable, ExportMismatch
from core.spec import ExportFormat
from core.train.checker import Checker, Pending, answers, shared
from core.train.data import Dataset
from core.train.device import is_out_of_memory
from core.train.metrics import ExportedModel
from core.train.model import Net, Normalized
from core.train.model_card import model_metadata
from core.train.verify_export import as_bytes

log = logging.getLogger("trainq.export")

ONNX_OPSET = ONNX_DEFAULT_OPSET  # torch.onnx.export's own default
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
    with _checker() as asker:
        ask = Ask(asker, x, expected, meta, check_timeout_s)
        blobs, report, pending = _export_each(wrapped, x, formats, meta, progress, ask)
        checked = _answered(ask, blobs, pending, progress)
    progress()
    for fmt, entry in checked.items():
        entry.pop("pid", None)
        report[fmt]["check_s"] = entry.pop("check_s", None)  # its load and run, in the check
        report[fmt]["waited_s"] = entry.pop("waited_s", None)  # asked -> answered
    models = _offered(blobs, checked, tolerance(expected), report)
    _required(formats, models, report)
    return Exports(models, report, time.perf_counter() - started)


@dataclass
class Ask:
    """How each exported format goes to be checked: to the worker's checker, or to one
    started for this export when there is none or it is gone."""

    checker: Asker
    x: torch.Tensor
    expected: torch.Tensor
    meta: dict[str, str]
    timeout_s: float
    arrays: tuple[bytes, bytes] = field(init=False)  # x's and expected's bytes, made once

    def __post_init__(self) -> None:
        self.arrays = (as_bytes(self.x), as_bytes(self.expected))

    def __call__(self, fmt: ExportFormat, blob: bytes) -> Pending:
        args = (fmt.value, blob, self.x, self.expected, self.meta, self.timeout_s, self.arrays)
        try:
            return self.checker.get().ask(*args)
        except OSError as e:
            log.warning("the worker's checker is gone (%s): starting one for this job", e)
            return self.checker.own().ask(*args)


def _answered(
    ask: Ask,
    blobs: dict[ExportFormat, bytes],
    pending: list[Pending],
    progress: Callable[[], None],
) -> dict[str, dict[str, Any]]:
    """The checks' answers. A checker that answers none in time is killed (stuck or broken:
    the worker starts another for the next job); where the worker's checker ended a check
    unanswered (it died, or the worker with it, while this horse lives on) the formats are
    asked again, of a checker of this export's own, in the time left."""
    deadline = time.monotonic() + ask.timeout_s
    try:
        return answers(pending, ask.timeout_s, progress)
    except ExportCheckUnavailable as e:
        ask.checker.get().kill()
        if ask.checker.mine is not None or time.monotonic() >= deadline:
            raise
        log.warning("the worker's checker answered no check (%s): asking one of our own", e)
    ask.checker.own()
    again = [ask(ExportFormat(p.fmt), blobs[ExportFormat(p.fmt)]) for p in pending]
    return answers(again, deadline - time.monotonic(), progress)


class Asker:
    """The worker's shared checker if there is one, else (or once it fails) one of our own,
    closed with the export."""

    def __init__(self) -> None:
        self.mine: Checker | None = None
        self.current = shared()
        if self.current is None:
            self.current = self.own()

    def get(self) -> Checker:
        assert self.current is not None
        return self.current

    def own(self) -> Checker:
        if self.mine is None:
            self.mine = Checker.start()
        self.current = self.mine
        return self.mine

    def close(self) -> None:
        if self.mine is not None:
            self.mine.close()


@contextmanager
def _checker() -> Iterator[Asker]:
    asker = Asker()
    try:
        yield asker
    finally:
        asker.close()


def _export_each(
    wrapped: Normalized,
    x: torch.Tensor,
    formats: Sequence[ExportFormat],
    meta: dict[str, str],
    progress: Callable[[], None],
    ask: Callable[[ExportFormat, bytes], Pending],
) -> tuple[dict[ExportFormat, bytes], dict[str, dict[str, Any]], list[Pending]]:
    """Each format's bytes, the report of each (its export time or why it failed), and its
    check, asked as soon as it is exported."""
    blobs: dict[ExportFormat, bytes] = {}
    report: dict[str, dict[str, Any]] = {}
    pending: list[Pending] = []
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
            pending.append(ask(fmt, blobs[fmt]))
        progress()
    return blobs, report, pending


def _portable(model: nn.Module, data: Dataset) -> Normalized:
    net = copy.deepcopy(model).float().cpu().to(memory_format=torch.contiguous_format).eval()
    if isinstance(net, Net):
        net.gradient_checkpointing = False
    return Normalized(net, data.normalization.mean, data.normalization.std).eval()


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
    # time of exporting the module again. What torch.onnx.export(dynamo=True) does, with the
    # table of ONNX functions built once per process (onnx_registry): building it is most
    # of a small model's export. The opset is the exporter's default.
    from torch.onnx._internal.exporter import _core

    program = _core.export(
        exported, (x,), registry=onnx_registry(), opset_version=ONNX_OPSET, verbose=False
    )
    proto = program.model_proto
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    blob: bytes = proto.SerializeToString()
    return blob


@functools.cache
def onnx_registry() -> Any:
    """The ONNX exporter's table of ONNX Script functions for ONNX_OPSET, as
    torch.onnx.export builds it at every call (half a second of parsing their source)."""
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib(opset_version=ONNX_OPSET)


def warm_up() -> None:
    """What a worker does once, before it forks work horses, so that no job pays it: the
    ONNX functions' table built, and a two-weight model exported to each format. Fake
    tensors and tensors of one element (too small for any op to go parallel): nothing starts
    a thread pool that the fork would lose, nor a thread (tqdm's monitor, which torch.fx's
    interpreter starts) that could hold a lock as the horse is forked. Nor does it set
    torch's thread count, which makes a pool of its own that horses then remake racing."""
    with _no_tqdm_monitor():
        _warm_exports()


def _warm_exports() -> None:
    wrapped = Normalized(nn.Sequential(nn.Flatten(), nn.Linear(1, 1)), (0.0,), (1.0,))
    x = torch.zeros(2, 1, 1, 1)
    program = _exported_program(wrapped.eval(), x)
    _pt2(program, {})
    _onnx(program, x, {})


@contextmanager
def _no_tqdm_monitor() -> Iterator[None]:
    try:
        from tqdm import tqdm
    except ImportError:
        yield
        return
    interval = tqdm.monitor_interval
    tqdm.monitor_interval = 0  # no monitor thread for the bars made meanwhile
    try:
        yield
    finally:
        tqdm.monitor_interval = interval


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

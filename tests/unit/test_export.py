from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.errors import ExportCheckUnavailable, ExportMismatch
from core.spec import ExportFormat
from core.train import TrainResult
from core.train.checker import VERIFIER, Checker, Pending, _report, answers
from core.train.data import load_dataset
from core.train.export import _offered, _required, tolerance
from core.train.verify_export import load_model, load_torchscript
from tests.conftest import Recorder

FRESH_PROCESS = """
import sys, warnings, torch
warnings.simplefilter("ignore")
model = torch.jit.load(sys.argv[1], map_location="cpu").eval()
x = torch.load(sys.argv[2])
with torch.inference_mode():
    torch.save(model(x), sys.argv[3])
"""


def torchscript_of(result: TrainResult) -> bytes:
    return result.models[ExportFormat.torchscript].data


@pytest.mark.slow
def test_torchscript_reloads_in_a_fresh_process_with_the_same_logits(
    two_epochs: tuple[TrainResult, Recorder], data_dir: Path, tmp_path: Path
) -> None:
    result, _ = two_epochs
    model_file = tmp_path / "model.pt"
    model_file.write_bytes(torchscript_of(result))
    test = load_dataset("mnist-sample", data_dir).test
    x = test.images.float().div(255)
    torch.save(x, tmp_path / "x.pt")
    subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, model_file, tmp_path / "x.pt", tmp_path / "y.pt"],
        check=True,
    )
    fresh = torch.load(tmp_path / "y.pt")
    with torch.inference_mode():
        here = load_torchscript(torchscript_of(result))(x)
    assert torch.allclose(fresh, here, atol=1e-5)
    # It is the trained model: it classifies the held-out digits as the trainer measured.
    accuracy = (fresh.argmax(1) == test.labels).float().mean().item()
    assert abs(accuracy - result.test_accuracy) < 0.002


def test_every_format_is_offered_and_predicts_as_torchscript_does(
    two_epochs: tuple[TrainResult, Recorder], data_dir: Path
) -> None:
    result, _ = two_epochs
    assert list(result.models) == list(ExportFormat)  # the default: all three
    x = load_dataset("mnist-sample", data_dir).test.images[:512].float().div(255)
    with torch.inference_mode():
        want = load_torchscript(torchscript_of(result))(x)
    for fmt, model in result.models.items():
        entry = result.record["formats"][fmt]
        assert entry["ok"] is True
        assert entry["sha256"] == model.sha256 == hashlib.sha256(model.data).hexdigest()
        assert entry["size"] == len(model.data)
        assert 0 <= entry["max_abs_diff"] <= tolerance(want)
        with torch.inference_mode():
            got = load_model(fmt, model.data)(x)  # onnxruntime for onnx
            one = load_model(fmt, model.data)(x[:1])  # the batch dimension is dynamic
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), fmt
        assert torch.equal(got.argmax(1), want.argmax(1)), fmt
        assert torch.allclose(one, want[:1], rtol=1e-4, atol=1e-4), fmt
    assert 0 < result.record["export_s"] < 120
    # Where the run's time went: its parts, and each format's export, check and wait.
    timings = result.record["timings"]
    assert set(timings) == {"data_s", "setup_s", "train_s", "export_s"}
    assert all(v >= 0 for v in timings.values()) and timings["train_s"] > 0
    assert timings["export_s"] == result.record["export_s"]
    for entry in result.record["formats"].values():
        assert 0 < entry["check_s"] <= entry["waited_s"] and entry["export_s"] > 0
        assert "pid" not in entry


@pytest.mark.slow
def test_a_corrupted_model_fails_its_check_in_the_fresh_process_and_is_not_offered(
    two_epochs: tuple[TrainResult, Recorder], data_dir: Path
) -> None:
    result, _ = two_epochs
    x = load_dataset("mnist-sample", data_dir).test.images[:64].float().div(255)
    with torch.inference_mode():
        expected = load_torchscript(torchscript_of(result))(x)
    blobs = {fmt: m.data for fmt, m in result.models.items()}
    blobs[ExportFormat.onnx] = blobs[ExportFormat.onnx][: len(blobs[ExportFormat.onnx]) // 2]
    pt2 = bytearray(blobs[ExportFormat.pt2])
    pt2[len(pt2) // 2 :] = bytes(len(pt2) - len(pt2) // 2)  # its weights' second half zeroed
    blobs[ExportFormat.pt2] = bytes(pt2)
    checked = check_each(blobs, x, expected)
    assert checked[ExportFormat.torchscript]["max_abs_diff"] <= tolerance(expected)
    assert "error" in checked[ExportFormat.onnx]
    assert "error" in checked[ExportFormat.pt2] or checked[ExportFormat.pt2]["max_abs_diff"] > 1
    report: dict[str, dict[str, object]] = {fmt: {} for fmt in blobs}
    offered = _offered(blobs, checked, tolerance(expected), report)
    assert list(offered) == [ExportFormat.torchscript]
    for fmt in (ExportFormat.pt2, ExportFormat.onnx):
        assert report[fmt]["ok"] is False and "sha256" not in report[fmt]
        assert str(report[fmt]["error"]).startswith(("check failed", "logits differ"))
    _required(list(ExportFormat), offered, report)  # TorchScript passed: the job succeeds


def test_a_format_whose_check_failed_or_differs_is_not_offered() -> None:
    """What the fresh process answered decides: an error, logits past the tolerance, or no
    answer of that format's at all leaves the format out, with the reason in the report."""
    blobs = {fmt: fmt.value.encode() for fmt in ExportFormat}
    checked: dict[str, dict[str, object]] = {
        ExportFormat.torchscript: {"max_abs_diff": 1e-6},
        ExportFormat.pt2: {"max_abs_diff": 0.5},
    }
    report: dict[str, dict[str, object]] = {fmt: {} for fmt in blobs}
    offered = _offered(blobs, checked, 1e-4, report)  # type: ignore[arg-type]
    assert list(offered) == [ExportFormat.torchscript]
    assert report[ExportFormat.torchscript]["ok"] is True
    assert str(report[ExportFormat.pt2]["error"]).startswith("logits differ")
    assert report[ExportFormat.onnx]["error"] == "check failed: the check did not report it"
    for fmt in (ExportFormat.pt2, ExportFormat.onnx):
        assert report[fmt]["ok"] is False and "sha256" not in report[fmt]
    checked[ExportFormat.pt2] = {"error": "RuntimeError: bad file"}
    _offered(blobs, checked, 1e-4, report)  # type: ignore[arg-type]
    assert report[ExportFormat.pt2]["error"] == "check failed: RuntimeError: bad file"


@pytest.mark.parametrize("answer", [b"", b"not json", b'{"pt2": {}}'])
def test_a_check_that_answers_nothing_usable_is_unavailable_not_passed(answer: bytes) -> None:
    """A check that died, or answered something else, is not the model's fault nor a pass:
    ExportCheckUnavailable (the job is retried)."""
    a, b = socket.socketpair()
    with a, b:
        pending = Pending("onnx", a, answer=bytearray(answer))
        with pytest.raises(ExportCheckUnavailable):
            _report(pending)


def test_torchscript_failing_or_every_format_failing_fails_the_export() -> None:
    failed = {"ok": False, "error": "check failed: it broke"}
    onnx = {ExportFormat.onnx: object()}
    report = {ExportFormat.torchscript: failed, ExportFormat.onnx: {"ok": True}}
    with pytest.raises(ExportMismatch, match="TorchScript: check failed: it broke"):
        _required([ExportFormat.torchscript, ExportFormat.onnx], onnx, report)  # type: ignore[arg-type]
    _required([ExportFormat.onnx], onnx, report)  # type: ignore[arg-type]
    with pytest.raises(ExportMismatch, match="no format passed"):
        _required([ExportFormat.pt2], {}, {ExportFormat.pt2: failed})


def check_each(
    blobs: dict[ExportFormat, bytes], x: torch.Tensor, expected: torch.Tensor
) -> dict[str, dict[str, object]]:
    checker = Checker.start()
    try:
        asked = [checker.ask(f, b, x, expected, None, 120) for f, b in blobs.items()]
        return answers(asked, 120)
    finally:
        checker.close()


def test_the_checking_process_imports_neither_trainq_nor_the_service() -> None:
    # What the checker imports as it starts and warms up, before it forks any check. (The
    # redis client library is left out: torch.export's loader imports it for its caches.)
    probe = (
        "import runpy, sys; runpy.run_path(sys.argv[1])['warm_up'](); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'core', 'api', 'worker', 'sqlalchemy', 'fastapi', 'rq', 'torchvision'}))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe, str(VERIFIER)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.splitlines() == ["[]"]

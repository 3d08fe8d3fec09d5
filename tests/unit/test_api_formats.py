"""Which formats a job offers, and why it does not offer one (api/formats.py)."""

from __future__ import annotations

from typing import Any

import pytest

from api.formats import DOWNLOAD_ORDER, PREDICT_ORDER, default_format, not_offered, offered_formats
from core.db import Job
from core.spec import ExportFormat, JobSpec


def job(record: dict[str, Any] | None, status: str = "succeeded", **spec: Any) -> Job:
    return Job(id="j1", status=status, spec=JobSpec(**spec).model_dump(mode="json"), record=record)


def test_a_format_that_failed_its_check_is_not_offered_and_says_why() -> None:
    formats = {
        "torchscript": {"ok": True, "sha256": "a" * 64},
        "pt2": {"ok": True, "sha256": "b" * 64},
        "onnx": {"ok": False, "error": "check failed: InvalidProtobuf: truncated"},
    }
    j = job({"formats": formats})
    assert offered_formats(j) == [ExportFormat.torchscript, ExportFormat.pt2]
    why = not_offered(j, ExportFormat.onnx)
    assert "it failed: check failed: InvalidProtobuf: truncated" in why
    assert why.endswith("Formats offered: torchscript, pt2")


def test_a_format_the_spec_left_out() -> None:
    j = job({"formats": {"pt2": {"ok": True}}}, export=["pt2"])
    assert offered_formats(j) == [ExportFormat.pt2]
    assert "its spec did not ask for it (export: pt2)" in not_offered(j, ExportFormat.torchscript)


def test_a_job_stored_before_formats_offers_torchscript_alone() -> None:
    old = Job(id="j0", status="succeeded", spec={"epochs": 1}, record={"result": {}})
    assert offered_formats(old) == [ExportFormat.torchscript]
    assert "did not ask for it (export: torchscript)" in not_offered(old, ExportFormat.onnx)
    assert offered_formats(job(None, status="running")) == []


def test_predict_can_run_every_format() -> None:
    assert sorted(PREDICT_ORDER) == sorted(ExportFormat)


@pytest.mark.parametrize(
    ("exported", "best"),
    [
        (["onnx"], ExportFormat.onnx),
        (["pt2"], ExportFormat.pt2),
        (["pt2", "onnx"], ExportFormat.onnx),
        (["onnx", "torchscript"], ExportFormat.torchscript),
        (["torchscript", "pt2", "onnx"], ExportFormat.torchscript),
    ],
)
def test_the_default_download_is_the_best_format_offered(
    exported: list[str], best: ExportFormat
) -> None:
    formats = {f: {"ok": True} for f in exported}
    assert default_format(job({"formats": formats}, export=exported)) == best


def test_a_job_that_offers_no_format_has_no_default() -> None:
    failed = {"onnx": {"ok": False, "error": "check failed"}}
    assert default_format(job({"formats": failed}, export=["onnx"])) is None
    assert default_format(job(None, status="running")) is None
    assert sorted(DOWNLOAD_ORDER) == sorted(ExportFormat)

"""A job's model formats over HTTP: which it offers, why one is not, which a download sends
by default and which answers predictions. See docs/jobs.md."""

from __future__ import annotations

from typing import Any

from core.db import Job
from core.spec import ExportFormat, JobStatus

MEDIA_TYPES = {
    ExportFormat.torchscript: "application/octet-stream",
    ExportFormat.pt2: "application/zip",  # torch.export's archive is a zip file
    ExportFormat.onnx: "application/x-protobuf",  # an ONNX ModelProto
}

# POST /jobs/{id}/predict runs the first of these that the job offers: ONNX on onnxruntime
# answers one request fastest on the CPU, then TorchScript, then pt2 (bench.predict_formats).
PREDICT_ORDER = (ExportFormat.onnx, ExportFormat.torchscript, ExportFormat.pt2)


# GET /jobs/{id}/model without ?format= sends the first of these that the job offers:
# TorchScript where the job has it (the download that was always the default), else ONNX,
# which any ONNX runtime loads without torch, else torch.export's archive.
DOWNLOAD_ORDER = (ExportFormat.torchscript, ExportFormat.onnx, ExportFormat.pt2)


def filename(job_id: str, fmt: ExportFormat) -> str:
    return f"trainq-{job_id}{fmt.suffix}"


def offered_formats(job: Job) -> list[ExportFormat]:
    """The formats whose model the job stored, as its run record lists them. A job that
    finished before models had formats stored TorchScript alone."""
    if job.status != JobStatus.succeeded or job.purged_at is not None:
        return []  # a purged job's models are gone (core.retention)
    formats = _record_formats(job)
    if formats is None:
        return [ExportFormat.torchscript]
    return [ExportFormat(f) for f, entry in formats.items() if entry.get("ok")]


def default_format(job: Job) -> ExportFormat | None:
    """The format a download sends when none is asked for: the best the job offers; None
    while it offers none."""
    offered = offered_formats(job)
    return next((fmt for fmt in DOWNLOAD_ORDER if fmt in offered), None)


def asked_formats(job: Job) -> list[ExportFormat]:
    """The formats the job's spec asked for (a spec from before `export`: TorchScript)."""
    return [ExportFormat(f) for f in job.spec.get("export", [ExportFormat.torchscript])]


def not_offered(job: Job, fmt: ExportFormat) -> str:
    """Why the succeeded `job` has no model in `fmt`, and what it has instead."""
    offered = ", ".join(offered_formats(job)) or "none"
    asked = asked_formats(job)
    entry = (_record_formats(job) or {}).get(fmt, {})
    if fmt not in asked:
        why = f"its spec did not ask for it (export: {', '.join(asked)})"
    elif entry.get("error"):
        why = f"it failed: {entry['error']}"
    else:
        why = "none was stored"
    return f"job {job.id} offers no {fmt} model: {why}. Formats offered: {offered}"


def _record_formats(job: Job) -> dict[str, dict[str, Any]] | None:
    formats = (job.record or {}).get("formats")
    return formats if isinstance(formats, dict) else None

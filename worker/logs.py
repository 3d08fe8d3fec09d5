"""Structured JSON logs: one object per line, with the job id on every line a job emits.
See docs/operations.md ("Watching it")."""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import sys

current_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("trainq_job", default=None)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        job = current_job.get()
        if job is not None:
            line["job_id"] = job
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def configure_json_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # RQ gives its worker logger a handler of its own unless it already has one.
    for name in ("rq.worker", "rq.job", "rq.queue"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
    # The ONNX exporter logs each optimizer pass at INFO, some forty lines a job; an
    # operator needs its warnings, not its progress.
    for name in ("onnxscript", "onnx_ir", "torch.onnx"):
        logging.getLogger(name).setLevel(max(level, logging.WARNING))

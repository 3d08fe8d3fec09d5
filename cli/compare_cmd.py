"""`trainq compare`: jobs side by side, the spec fields that differ (with a count of those
equal) and the final metrics."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic_core import to_jsonable_python

from cli.client_cmd import client
from cli.table import aligned, cell
from client.http import Client
from core.spec import BEFORE_FIELD, JobSpec

# Each final metric and how it is shown.
METRICS = {
    "test_accuracy": "{:.4f}",
    "test_loss": "{:.4f}",
    "train_loss": "{:.4f}",
    "epochs": "{}",
    "images_per_second": "{:,.0f}",
    "duration_s": "{:.1f}",
}


def compare_command(args: argparse.Namespace) -> int:
    with client(args) as c:
        jobs = [c.job(c.find_job_id(given)) for given in args.job_ids]
        metrics = [final_metrics(c, job) for job in jobs]
    print("\n".join(compare_table(jobs, metrics)))
    return 0


def final_metrics(c: Client, job: dict[str, Any]) -> dict[str, Any]:
    """The result of a job that ended well; else (a pruned or failed one) its last epoch."""
    if job["result"]:
        return dict(job["result"])
    epochs = c.epochs(job["id"])
    if not epochs:
        return {}
    return {**epochs[-1], "epochs": len(epochs)}


def full_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """With JobSpec's defaults under it, so that a field left out compares equal to its
    default; a field the row was stored without means what it did then (BEFORE_FIELD), as
    the worker reads it. Not validated: a spec stored before a rule that refuses it still
    compares."""
    before = {k: v for k, v in to_jsonable_python(BEFORE_FIELD).items() if k not in spec}
    return {**JobSpec().model_dump(mode="json"), **before, **spec}


def spec_diff(specs: list[dict[str, Any]]) -> tuple[list[str], int]:
    """The fields whose values differ between the specs, and how many are equal."""
    full = [full_spec(s) for s in specs]
    names = list(dict.fromkeys(name for spec in full for name in spec))
    differ = [n for n in names if len({repr(spec.get(n)) for spec in full}) > 1]
    return differ, len(names) - len(differ)


def compare_table(jobs: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> list[str]:
    specs = [full_spec(job["spec"]) for job in jobs]
    differ, equal = spec_diff([job["spec"] for job in jobs])
    rows = [["", *(job["id"][:8] for job in jobs)]]
    rows += [[name, *(cell(spec.get(name)) for spec in specs)] for name in differ]
    rows.append(["status", *(job["status"] for job in jobs)])
    rows += [
        [name, *("-" if m.get(name) is None else shown.format(m[name]) for m in metrics)]
        for name, shown in METRICS.items()
        if any(name in m for m in metrics)
    ]
    lines = aligned(rows)
    split = 1 + len(differ)  # after the spec fields, before the metrics
    same = f"({equal} spec fields equal)" if differ else f"(all {equal} spec fields equal)"
    return [*lines[:split], same, "", *lines[split:]]

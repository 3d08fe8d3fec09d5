"""`trainq`: the command line.

The commands are a table of names: a command's module is imported only when that command
runs, and only the chosen command's arguments are built, so `trainq --help` loads argparse
alone, and the commands that talk to the API never load torch or the server's libraries
(and work on the light install, `pip install trainq`).
See docs/api.md ("The CLI")."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from cli import options, resource_options

Runner = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    help: str
    options: Callable[[argparse.ArgumentParser], None]
    run: str  # "module:function", imported when the command runs
    # Options whose value may start with "-" (`ls --sort -test_accuracy`), which argparse
    # would otherwise read as an option of its own.
    dashed: tuple[str, ...] = ()

    def runner(self) -> Runner:
        module, _, name = self.run.partition(":")
        return cast(Runner, getattr(importlib.import_module(module), name))


COMMANDS = {
    "submit": Command(
        "Submit a training job to the API.", options.submit_options, "cli.client_cmd:submit_command"
    ),
    "ls": Command(
        "List jobs: newest first, or by --sort; filtered by status, tag, name, data set, ...",
        options.ls_options,
        "cli.client_cmd:ls_command",
        dashed=("--sort",),
    ),
    "tag": Command(
        "Add (+TAG) or take off (-TAG) a job's tags.",
        options.tag_options,
        "cli.label_cmd:tag_command",
    ),
    "rename": Command("Name a job.", options.rename_options, "cli.label_cmd:rename_command"),
    "note": Command(
        "Write why a job was run (its notes).", options.note_options, "cli.label_cmd:note_command"
    ),
    "watch": Command(
        "Follow a job live: progress bar, epochs, a loss sparkline.",
        options.job_options,
        "cli.client_cmd:watch_command",
    ),
    "sweep": Command(
        "Search hyperparameters (Optuna, in the service) and follow the trials live; "
        "`sweep watch|list|cancel|show` for sweeps already started.",
        options.sweep_options,
        "cli.sweep_cmd:sweep_command",
    ),
    "compare": Command(
        "Jobs side by side: the spec fields that differ, and the final metrics.",
        options.compare_options,
        "cli.compare_cmd:compare_command",
    ),
    "cancel": Command(
        "Cancel a queued or running job.", options.job_options, "cli.client_cmd:cancel_command"
    ),
    "download": Command(
        "Download a job's model: TorchScript, pt2 or ONNX (sha256 checked).",
        options.download_options,
        "cli.client_cmd:download_command",
    ),
    "confusion": Command(
        "A job's confusion matrix and per-class accuracy, by class name.",
        options.confusion_options,
        "cli.classes_cmd:confusion_command",
    ),
    "predict": Command(
        "Classify image files with a job's model: the top labels and their probabilities.",
        options.predict_options,
        "cli.classes_cmd:predict_command",
    ),
    "model": Command(
        "The model registry: register a job's model as a named model's version, list, "
        "move aliases, download and predict by NAME@ALIAS or NAME/VERSION.",
        resource_options.model_options,
        "cli.model_cmd:model_command",
    ),
    "webhook": Command(
        "Signed webhooks: `webhook add URL --event job.succeeded`, `ls`, `rm`, `test`, "
        "`deliveries`, `enable`; with an admin key, `pause` and `resume` every delivery.",
        resource_options.webhook_options,
        "cli.webhook_cmd:webhook_command",
    ),
    "usage": Command(
        "Show the key's quotas and what it uses of them (an admin key: every key's).",
        options.api_options,
        "cli.client_cmd:usage_command",
    ),
    "migrate": Command(
        "Create or upgrade the database schema (Alembic, to head).",
        options.no_options,
        "cli.service_cmd:migrate_command",
    ),
    "serve": Command(
        "Run the HTTP API (uvicorn).", options.serve_options, "cli.service_cmd:serve_command"
    ),
    "worker": Command(
        "Run one RQ worker per GPU (or one on the CPU).",
        options.worker_options,
        "cli.service_cmd:worker_command",
    ),
    "up": Command(
        "Everything on one machine: Redis, migrated DB, API, workers.",
        options.up_options,
        "cli.service_cmd:up_command",
    ),
    "data": Command(
        "Install a built-in data set (mnist, fashion-mnist), verified against its pins; "
        "upload a folder or archive of your own.",
        resource_options.data_options,
        "cli.data_cmd:data_command",
    ),
    "gc": Command(
        "Purge the step rows, checkpoints and models of jobs past the retention age.",
        options.gc_options,
        "cli.gc_cmd:gc_command",
    ),
    "backup": Command(
        "Copy a SQLite-backed trainq's database (online) and data folder files to a folder.",
        options.backup_options,
        "cli.backup_cmd:backup_command",
    ),
    "restore": Command(
        "Put a backup back, checked first; webhook delivery paused. The service stopped.",
        options.restore_options,
        "cli.backup_cmd:restore_command",
    ),
    "train": Command(
        "Train locally (no service): progress bar, model and run record out.",
        options.train_options,
        "cli.train_cmd:train_command",
    ),
}


EXIT_CODES = """exit codes:
  0    done
  1    the API refused or the job failed (the message says why)
  2    an invalid option, job spec or sweep
  3    the sweep was canceled (sweep, sweep watch)
  69   the API cannot be reached (its address: --url or TRAINQ_API_URL)
  130  stopped by ^C"""


def parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Every command is listed; only the one named first in `argv` gets its arguments (the
    job spec's options need the JobSpec, which costs more than the rest of the start-up)."""
    chosen = argv[0] if argv else None
    parser = argparse.ArgumentParser(
        prog="trainq",
        description="Training-as-a-service for PyTorch",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command_parser = sub.add_parser(name, help=command.help, description=command.help)
        if name == chosen:
            command.options(command_parser)
    return parser


def glued(argv: list[str]) -> list[str]:
    """`--sort -x` as `--sort=-x`, for the chosen command's `dashed` options."""
    command = COMMANDS.get(argv[0]) if argv else None
    dashed = command.dashed if command else ()
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in dashed and arg.startswith("-"):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = glued(sys.argv[1:] if argv is None else list(argv))
    args = parser_for(argv).parse_args(argv)
    try:
        return COMMANDS[args.command].runner()(args)
    except Exception as e:
        # Loaded only here: what it reads (pydantic, httpx) is loaded already by whatever
        # raised, and `trainq --help` stays light.
        from cli.problems import exit_code

        code = exit_code(e)
        if code is None:
            raise  # not a thing a user can cause: its traceback is wanted
        return code

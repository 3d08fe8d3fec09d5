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

from cli import options

Runner = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    help: str
    options: Callable[[argparse.ArgumentParser], None]
    run: str  # "module:function", imported when the command runs

    def runner(self) -> Runner:
        module, _, name = self.run.partition(":")
        return cast(Runner, getattr(importlib.import_module(module), name))


COMMANDS = {
    "submit": Command(
        "Submit a training job to the API.", options.submit_options, "cli.client_cmd:submit_command"
    ),
    "ls": Command("List jobs, newest first.", options.ls_options, "cli.client_cmd:ls_command"),
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
        options.data_options,
        "cli.data_cmd:data_command",
    ),
    "gc": Command(
        "Purge the step rows, checkpoints and models of jobs past the retention age.",
        options.gc_options,
        "cli.gc_cmd:gc_command",
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
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

"""`trainq`: the command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.errors import field_problems
from core.spec import JobSpec

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Command]] = {}


def command(
    name: str, help: str, options: Callable[[argparse.ArgumentParser], None]
) -> Callable[[Command], Command]:
    def register(fn: Command) -> Command:
        COMMANDS[name] = (help, options, fn)
        return fn

    return register


def add_spec_options(parser: argparse.ArgumentParser) -> None:
    """One option per JobSpec field; values are validated by JobSpec itself."""
    group = parser.add_argument_group("job spec (see JobSpec; defaults are the fastest choice)")
    for name, field in JobSpec.model_fields.items():
        default = field.default
        shown = getattr(default, "value", default)
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"spec_{name}",
            metavar="V",
            help=f"{field.description or ''} (default: {shown})".strip(),
        )
    group.add_argument("--spec", type=Path, help="a JSON file with the spec; options override")


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    values: dict[str, Any] = json.loads(args.spec.read_text()) if args.spec else {}
    for key, value in vars(args).items():
        if key.startswith("spec_") and value is not None:
            values[key.removeprefix("spec_")] = value
    return JobSpec.model_validate(values)


def format_validation_error(e: ValidationError) -> str:
    return "\n  ".join(["invalid job spec:", *field_problems(e)])


def main(argv: Sequence[str] | None = None) -> int:
    # Importing the command modules registers them.
    from cli import client_cmd, service_cmd, train_cmd  # noqa: F401

    parser = argparse.ArgumentParser(prog="trainq", description="Training-as-a-service for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, options, _) in COMMANDS.items():
        options(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][2](args)
    except ValidationError as e:
        print(format_validation_error(e), file=sys.stderr)
        return 2

"""`trainq sweep`'s search flags: one per JobSpec field, each a range, a list or one value,
made into the body of POST /sweeps. A flag the API would refuse only after a round trip
(an unknown form, a range that is not two numbers) is refused here, naming the flag."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

Scalar = bool | int | float | str | None

# The sweep's own options: a JobSpec field of the same name (seed) takes a `job-` prefix.
SWEEP_OPTIONS = frozenset(
    {
        "objective",
        "sampler",
        "seed",
        "pruner",
        "min_epochs",
        "reduction_factor",
        "trials",
        "parallel",
        "idempotency_key",
        "json",
        "detach",
    }
)
# The flag's form -> the API's name of the dimension, and the type of its bounds.
RANGES: dict[str, tuple[str, type[int] | type[float]]] = {
    "uniform": ("uniform", float),
    "loguniform": ("log_uniform", float),
    "int": ("int_uniform", int),
    "logint": ("log_int_uniform", int),
}
FORMS = "uniform:LO,HI, loguniform:LO,HI, int:LO,HI, logint:LO,HI, a list A,B,C or one value"
FORM = re.compile(r"^([A-Za-z_]+):(.*)$")
DIRECTIONS = {"max": "maximize", "maximize": "maximize", "min": "minimize", "minimize": "minimize"}


class FlagError(ValueError):
    """A flag refused before any request; the message names it."""


def flag_of(field: str) -> str:
    name = field.replace("_", "-")
    return f"--job-{name}" if field in SWEEP_OPTIONS else f"--{name}"


def add_search_options(parser: argparse.ArgumentParser) -> None:
    """One flag per JobSpec field, so that a new field is searchable without a CLI change."""
    from cli.help_text import help_text
    from core.spec import JobSpec

    group = parser.add_argument_group(
        "search space (any JobSpec field)",
        f"each takes {FORMS}; e.g. --lr loguniform:1e-4,1e-2 --batch-size 64,128 --epochs 8",
    )
    for name, field in JobSpec.model_fields.items():
        group.add_argument(
            flag_of(name), dest=f"field_{name}", metavar="V", help=help_text(field.description)
        )


def scalar(text: str) -> Scalar:
    """A value as the API takes it: true/false/null, an integer, a number, else text
    ("none" stays text: it is a value of several JobSpec enums)."""
    words: dict[str, Scalar] = {"true": True, "false": False, "null": None}
    if text in words:
        return words[text]
    for kind in (int, float):
        # "inf" and "nan" parse as floats but no JobSpec field takes them: leave them text.
        if any(ch.isdigit() for ch in text):
            try:
                return kind(text)
            except ValueError:
                pass
    return text


def dimension(flag: str, text: str) -> dict[str, Any] | Scalar:
    """A range or a choice (a dimension of the space), or one value (fixed)."""
    form = FORM.match(text)
    if form and form[1] in RANGES:
        return _range(flag, form[1], form[2])
    if form and all(_is_number(part) for part in form[2].split(",")):
        raise FlagError(f"{flag} {text}: unknown form {form[1]!r}; use {FORMS}")
    items = text.split(",")
    if len(items) == 1:
        return scalar(text)
    if any(not item.strip() for item in items):
        raise FlagError(f"{flag} {text}: an empty item in the list")
    return {"choice": [scalar(item.strip()) for item in items]}


def _range(flag: str, form: str, bounds: str) -> dict[str, Any]:
    name, kind = RANGES[form]
    parts = bounds.split(",")
    if len(parts) != 2:
        raise FlagError(f"{flag} {form}:{bounds}: give two bounds, {form}:LO,HI")
    try:
        low, high = (kind(p.strip()) for p in parts)
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise FlagError(f"{flag} {form}:{bounds}: the bounds must be {what}") from None
    if low > high:
        raise FlagError(f"{flag} {form}:{bounds}: LO {low} is above HI {high}")
    return {name: [low, high]}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def objective(text: str) -> dict[str, str]:
    """METRIC or METRIC:max|min."""
    metric, _, goal = text.partition(":")
    if not goal:
        return {"metric": metric}
    if goal not in DIRECTIONS:
        raise FlagError(f"--objective {text}: the direction is max or min")
    return {"metric": metric, "direction": DIRECTIONS[goal]}


def sweep_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /sweeps body: the --json file's, with each flag given over it."""
    body: dict[str, Any] = _from_file(args.body_file) if args.body_file else {}
    base, space = _fields(args)
    body["base"] = {**body.get("base", {}), **base}
    body["space"] = {**body.get("space", {}), **space}
    if not body["space"]:
        raise FlagError(
            "nothing to search: give a field a range or a list, e.g. --lr loguniform:1e-4,1e-2"
        )
    if args.objective:
        body["objective"] = objective(args.objective)
    _merge(body, "sampler", name=args.sampler, seed=args.seed)
    _merge(
        body,
        "pruner",
        name=args.pruner,
        min_epochs=args.min_epochs,
        reduction_factor=args.reduction_factor,
    )
    body.update(_given(trials=args.trials, parallel=args.parallel))
    return body


def _merge(body: dict[str, Any], key: str, **values: Any) -> None:
    """The options given over the file's; none given and none in the file: the API's
    defaults."""
    merged = {**body.get(key, {}), **_given(**values)}
    if merged:
        body[key] = merged


def _fields(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The field flags given: fixed values into the base, ranges and lists into the space."""
    from core.spec import JobSpec

    base: dict[str, Any] = {}
    space: dict[str, Any] = {}
    for name, field in JobSpec.model_fields.items():
        text = getattr(args, f"field_{name}", None)
        if text is None:
            continue
        if isinstance(field.default, tuple):  # a list field (export): its items, not a choice
            base[name] = text.split(",")
            continue
        value = dimension(flag_of(name), text)
        if isinstance(value, dict):
            space[name] = value
        else:
            base[name] = value
    return base, space


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _from_file(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise FlagError(f"--json {path}: {e}") from None
    if not isinstance(body, dict):
        raise FlagError(f"--json {path}: not a JSON object")
    for key in ("base", "space", "objective", "sampler", "pruner"):
        if key in body and not isinstance(body[key], dict):
            raise FlagError(f"--json {path}: {key!r} must be a JSON object")
    return body

"""`trainq model`: the model registry from the shell. `register JOB NAME` makes a job's model
the next version of a named model, `ls [NAME]` lists models (or one model's versions and
aliases), `alias NAME ALIAS VERSION` moves an alias, `download` and `predict` take a version
as NAME@ALIAS (NAME@latest: the newest) or NAME/VERSION. Light, as the other client
commands. See docs/registry.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cli.classes_cmd import prediction_lines
from cli.client_cmd import client
from cli.problems import INVALID, shown
from cli.table import aligned
from client.registry import model_path

SUFFIXES = {"torchscript": ".pt", "pt2": ".pt2", "onnx": ".onnx"}


def model_command(args: argparse.Namespace) -> int:
    commands = {
        "register": register,
        "ls": list_models,
        "alias": move_alias,
        "download": download,
        "predict": predict,
    }
    return commands[args.model_command](args)


def register(args: argparse.Namespace) -> int:
    with client(args) as c:
        version = c.register_model(c.find_job_id(args.job_id), args.name, args.owner)
    print(f"{version['model']} version {version['version']} (job {version['job_id']})")
    return 0


def list_models(args: argparse.Namespace) -> int:
    with client(args) as c:
        if args.name is None:
            lines = models_table(list(c.models()))
        else:
            lines = model_lines(c.model(args.name, args.owner, limit=args.limit))
    print("\n".join(lines))
    return 0


def models_table(models: list[dict[str, Any]]) -> list[str]:
    if not models:
        return ["no models yet: trainq model register JOB NAME"]
    rows = [["name", "owner", "versions", "latest", "aliases"]]
    for m in models:
        owner = f"{m['owner']} (shared)" if m["read_only"] else m["owner"]
        aliases = ", ".join(f"{a['alias']}→{a['version']}" for a in m["aliases"]) or "-"
        latest = "-" if m["latest_version"] is None else str(m["latest_version"])
        rows.append([m["name"], owner, str(m["version_count"]), latest, aliases])
    return [shown(line) for line in aligned(rows)]


def model_lines(model: dict[str, Any]) -> list[str]:
    """One model: its versions with their metrics and lineage, then its aliases."""
    rows = [["version", "job", "accuracy", "dataset", "formats", "aliases", "registered"]]
    for v in model["versions"]:
        metrics = v["lineage"]["metrics"] or {}
        accuracy = metrics.get("test_accuracy")
        rows.append(
            [
                str(v["version"]),
                v["job_id"][:8],
                "-" if accuracy is None else f"{accuracy:.4f}",
                v["lineage"]["dataset"],
                ",".join(f["format"] for f in v["lineage"]["formats"]),
                ",".join(v["aliases"]) or "-",
                v["registered_at"][:19],
            ]
        )
    lines = [f"model {model['name']} of {model['owner']}: {model['version_count']} version(s)"]
    lines += aligned(rows)
    for a in model["aliases"]:
        lines.append(f"{a['alias']} → {a['version']} (moved by {a['moved_by']}, {a['moved_at']})")
    return [shown(line) for line in lines]


def move_alias(args: argparse.Namespace) -> int:
    with client(args) as c:
        moved = c.move_alias(args.name, args.alias, args.version, args.expect, args.owner)
    was = moved["previous_version"]
    if not moved["moved"]:
        print(f"{args.name}@{moved['alias']} points at version {moved['version']} already")
    else:
        came = "new" if was is None else f"was {was}"
        print(f"{args.name}@{moved['alias']} → version {moved['version']} ({came})")
    return 0


def download(args: argparse.Namespace) -> int:
    try:
        model_path(args.ref)
    except ValueError as e:
        print(f"trainq: {shown(e)}", file=sys.stderr)
        return INVALID
    with client(args) as c:
        version = c.model_version(args.ref, args.owner)  # an alias, read once
        fmt = args.format or version["default_format"]
        suffix = SUFFIXES.get(str(fmt), "")
        path = args.output or Path(f"{version['model']}-v{version['version']}{suffix}")
        # By number, not by the alias: the file is the version it is named after, even if
        # the alias moves meanwhile.
        ref = f"{version['model']}/{version['version']}"
        got = c.download_model(ref, path, format=fmt, owner=args.owner)
    unverified = "" if got.verified else " (not verified: the API sent no sha256 in its ETag)"
    print(f"{path} sha256 {got.sha256}{unverified}", file=sys.stderr)
    return 0


def predict(args: argparse.Namespace) -> int:
    missing = [str(p) for p in args.images if not p.is_file()]
    if missing:
        print(f"trainq: not an image file: {', '.join(missing)}", file=sys.stderr)
        return 1
    try:
        model_path(args.ref)
    except ValueError as e:
        print(f"trainq: {shown(e)}", file=sys.stderr)
        return INVALID
    with client(args) as c:
        answer = c.predict_model(args.ref, list(args.images), args.top, args.owner)
    print(shown(f"{answer['model']} version {answer['version']} (job {answer['job_id']})"))
    for path, prediction in zip(args.images, answer["predictions"], strict=True):
        print("\n".join(prediction_lines(path, prediction)))
    return 0

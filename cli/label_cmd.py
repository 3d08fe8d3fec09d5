"""`trainq tag`, `rename`, `note`: a job's labels (core.labels: its name, tags and notes, no
part of its spec), changed through PATCH /jobs/{id}. Light: no torch, none of the server's
libraries. See docs/api.md ("The CLI")."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cli.client_cmd import client
from cli.options import api_options
from cli.problems import INVALID, shown


def tag_command(args: argparse.Namespace) -> int:
    """`trainq tag JOB +a -b c`: a and c added, b taken off, in one change (so another
    change at once keeps its own); the tags after it are printed."""
    given = argparse.ArgumentParser(prog="trainq tag", add_help=False, allow_abbrev=False)
    api_options(given, inherited=True)
    api, changes = given.parse_known_args(args.changes)
    for name, value in vars(api).items():
        setattr(args, name, value)
    add = [c.removeprefix("+") for c in changes if not c.startswith("-")]
    remove = [c.removeprefix("-") for c in changes if c.startswith("-")]
    if "" in add or "" in remove:
        print("trainq: a change is +TAG or -TAG, with a tag after the sign", file=sys.stderr)
        return INVALID
    with client(args) as c:
        job_id = c.find_job_id(args.job_id)
        job = c.relabel(job_id, add_tags=add, remove_tags=remove) if changes else c.job(job_id)
    print(shown(" ".join(job["tags"])))
    return 0


def rename_command(args: argparse.Namespace) -> int:
    return _relabel(args, name=args.name or None)


def note_command(args: argparse.Namespace) -> int:
    return _relabel(args, notes=args.notes or None)


def _relabel(args: argparse.Namespace, **change: Any) -> int:
    with client(args) as c:
        job = c.relabel(c.find_job_id(args.job_id), **change)
    print(f"{job['id']} {shown(job['name'] or '-')}")
    return 0

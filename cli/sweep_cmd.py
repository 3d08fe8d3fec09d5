"""`trainq sweep`: start a hyperparameter search and follow it live; `sweep watch`, `list`,
`cancel` and `show` for the sweeps already made. Light, like the other client commands: the
search itself (Optuna) runs in the service, never here.
See docs/sweeps.md ("From the command line")."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from cli.client_cmd import client
from cli.problems import INTERRUPTED, refused
from cli.sweep_args import FlagError, sweep_body
from cli.sweep_view import EXIT_CODES, LiveView, final_report
from cli.table import aligned
from client.http import ApiError, Client


def sweep_command(args: argparse.Namespace) -> int:
    commands = {
        None: start,
        "watch": watch,
        "list": list_sweeps,
        "cancel": cancel,
        "show": show,
    }
    return commands[args.sweep_command](args)


def start(args: argparse.Namespace) -> int:
    try:
        body = sweep_body(args)
    except FlagError as e:
        print(f"trainq sweep: {e}", file=sys.stderr)
        return 2
    with client(args) as c:
        try:
            sweep = c.create_sweep(
                body, args.idempotency_key, name=args.name, tags=args.tags, notes=args.notes
            )
        except ApiError as e:
            return refused(e, "the sweep")
        if args.detach:
            print(sweep["id"])
            return 0
        print(
            f"sweep {sweep['id']}: {sweep['budget']['trials']} trials "
            f"(follow it again: trainq sweep watch {sweep['id']})",
            file=sys.stderr,
        )
        return follow(c, sweep["id"])


def watch(args: argparse.Namespace) -> int:
    with client(args) as c:
        return follow(c, c.find_sweep_id(args.sweep_id))


def follow(c: Client, sweep_id: str) -> int:
    """The live view until the sweep ends, then its report. ^C stops watching only."""
    try:
        # Asked once first: the stream reconnects until the API answers, but a sweep that
        # does not exist, or an API that is not there, should say so at once.
        last = c.sweep(sweep_id)
    except ApiError as e:
        return refused(e)
    view = LiveView(sys.stderr, tty=sys.stderr.isatty())
    try:
        for last in c.sweep_events(sweep_id):
            view.update(last)
    except KeyboardInterrupt:
        view.close(erase=False)
        print(
            f"\nstopped watching; sweep {sweep_id} goes on. Follow it again with "
            f"`trainq sweep watch {sweep_id}`, cancel it with `trainq sweep cancel {sweep_id}`",
            file=sys.stderr,
        )
        return INTERRUPTED
    except ApiError as e:
        view.close(erase=False)
        return refused(e)
    view.close(erase=True)
    return ended(last)


def ended(sweep: dict[str, Any]) -> int:
    print("\n".join(final_report(sweep)))
    code = EXIT_CODES.get(sweep["status"], 1)
    if code:
        print(f"trainq: sweep {sweep['id']} {sweep['status']} (exit {code})", file=sys.stderr)
    return code


def list_sweeps(args: argparse.Namespace) -> int:
    rows = [["id", "status", "ended", "pruned", "best", "objective", "created"]]
    with client(args) as c:
        for i, sweep in enumerate(c.sweeps()):
            if i >= args.limit:
                break
            rows.append(_listed(sweep))
    print("\n".join(aligned(rows)))
    return 0


def _listed(sweep: dict[str, Any]) -> list[str]:
    b, best, o = sweep["budget"], sweep["best"], sweep["objective"]
    return [
        sweep["id"],
        sweep["status"],
        f"{b['ended']}/{b['trials']}",
        str(b["pruned"]),
        "-" if best is None else f"{best['value']:.4f}",
        f"{o['metric']} ({o['direction']})",
        sweep["created_at"],
    ]


def _answer(
    args: argparse.Namespace, call: Callable[[Client, str], dict[str, Any]]
) -> dict[str, Any]:
    """`call(client, sweep id)`: the API's answer about the sweep that `args` names."""
    with client(args) as c:
        return call(c, c.find_sweep_id(args.sweep_id))


def cancel(args: argparse.Namespace) -> int:
    sweep = _answer(args, Client.cancel_sweep)
    ended_ = sweep["budget"]["ended"]
    print(f"{sweep['id']} {sweep['status']} ({ended_} trials ended keep their results)")
    return 0


def show(args: argparse.Namespace) -> int:
    sweep = _answer(args, Client.sweep)
    if args.as_json:
        print(json.dumps(sweep, indent=2))
    else:
        print("\n".join(final_report(sweep)))
    return 0

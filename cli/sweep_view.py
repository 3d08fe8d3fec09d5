"""A sweep on the terminal: its trials as a table, the report printed at its end, and the live
view that follows it (a progress bar over the budget and the table, redrawn in place on a
terminal; elsewhere, only what changed, a line each, so that logs stay readable)."""

from __future__ import annotations

import shutil
import time
from typing import Any, TextIO

from tqdm import tqdm

from cli.table import aligned, cell

Sweep = dict[str, Any]

# The exit code of `trainq sweep` and `trainq sweep watch` for each way a sweep ends.
EXIT_CODES = {"succeeded": 0, "failed": 1, "canceled": 3}


def searched(sweep: Sweep) -> list[str]:
    """The fields the space searches, in the order the request gave them."""
    space = sweep["spec"].get("space", {})
    names = [name for name, dim in space.items() if isinstance(dim, dict)]
    for trial in sweep["trials"]:
        names += [name for name in trial["params"] if name not in names]
    return names


def trial_rows(sweep: Sweep) -> list[list[str]]:
    """Header, then one row a trial: the best one's number marked with *."""
    params, metric = searched(sweep), sweep["objective"]["metric"]
    best = (sweep["best"] or {}).get("number")
    rows = [["trial", "status", *params, metric, "epochs"]]
    for t in sweep["trials"]:
        value = "-" if t["value"] is None else f"{t['value']:.4f}"
        mark = "*" if t["number"] == best else ""
        param_cells = [cell(t["params"][p]) if p in t["params"] else "-" for p in params]
        rows.append(
            [f"{t['number']}{mark}", t["status"], *param_cells, value, str(len(t["values"]))]
        )
    return rows


def trial_table(sweep: Sweep) -> list[str]:
    return aligned(trial_rows(sweep))


def headline(sweep: Sweep) -> str:
    b, o = sweep["budget"], sweep["objective"]
    return (
        f"sweep {sweep['id']}  {sweep['status']}  {b['ended']}/{b['trials']} trials ended, "
        f"{b['pruned']} pruned, {b['in_flight']} in flight  ({o['direction']} {o['metric']})"
    )


def final_report(sweep: Sweep) -> list[str]:
    """The headline, the table, the failed trials' reasons, then the best trial and how to
    download its model."""
    lines = [headline(sweep), *trial_table(sweep)]
    for t in sweep["trials"]:
        if t["status"] == "failed" and t["error"]:
            lines.append(f"trial {t['number']} failed: {t['error']['message']}")
    best = sweep["best"]
    if best is None:
        lines.append("no trial succeeded: no best trial")
        return lines
    params = "  ".join(f"{k}={cell(v)}" for k, v in best["params"].items())
    lines += [
        f"best: trial {best['number']}  {sweep['objective']['metric']} {best['value']:.4f}  "
        f"{params}",
        f"job {best['job_id']}",
        f"download its model: trainq download {best['job_id']}",
    ]
    return lines


def budget_postfix(sweep: Sweep) -> str:
    b = sweep["budget"]
    best = sweep["best"]
    shown = f", best {best['value']:.4f}" if best else ""
    return f"{b['pruned']} pruned, {b['in_flight']} in flight{shown}"


class LiveView:
    """Follows a sweep event by event. `tty`: the table is redrawn in place above a tqdm
    bar; otherwise each changed trial, and the budget when it moves, is printed as a line."""

    def __init__(self, stream: TextIO, tty: bool) -> None:
        self.stream, self.tty = stream, tty
        self.started = time.monotonic()
        self.bar: tqdm[Any] | None = None
        self.drawn = 0  # lines of the table on screen (tty)
        self.printed: dict[int, str] = {}  # each trial's last line (not tty)
        self.progress: tuple[Any, ...] = ()

    def update(self, sweep: Sweep) -> None:
        if self.tty:
            self._redraw(sweep)
        else:
            self._print_changes(sweep)

    def close(self, erase: bool) -> None:
        """Erase the live table (the report follows) or leave it (watching stopped)."""
        if self.bar is not None:
            self.bar.clear()
            if erase:
                self._erase()
            self.bar.close()

    def _redraw(self, sweep: Sweep) -> None:
        if self.bar is None:
            self.bar = tqdm(
                total=sweep["budget"]["trials"],
                unit="trial",
                desc=f"sweep {sweep['id'][:8]}",
                file=self.stream,
                dynamic_ncols=True,
                leave=False,
            )
        self.bar.clear()
        self._erase()
        lines = self._fitting(trial_table(sweep))
        if sweep["waiting"]:
            lines.append(f"waiting: {sweep['waiting']}")
        self.stream.write("\n".join(lines) + "\n")
        self.drawn = len(lines)
        self.bar.n = sweep["budget"]["ended"]
        self.bar.set_postfix_str(budget_postfix(sweep), refresh=False)
        self.bar.refresh()

    def _erase(self) -> None:
        if self.drawn:
            self.stream.write(f"\x1b[{self.drawn}A\x1b[J")  # up to the table's top; clear below
            self.drawn = 0

    def _fitting(self, table: list[str]) -> list[str]:
        """The header and the latest trials: a table taller than the screen could not be
        redrawn in place."""
        room = shutil.get_terminal_size().lines - 3
        if len(table) <= room:
            return table
        kept = max(room - 2, 1)
        return [table[0], f"... {len(table) - 1 - kept} earlier trials", *table[-kept:]]

    def _print_changes(self, sweep: Sweep) -> None:
        rows = trial_rows(sweep)
        for t, row in zip(sweep["trials"], rows[1:], strict=True):
            line = _trial_line(rows[0], row)
            if self.printed.get(t["number"]) != line:
                self.printed[t["number"]] = line
                self.stream.write(line + "\n")
        b = sweep["budget"]
        progress = (b["ended"], budget_postfix(sweep), sweep["waiting"])
        if progress != self.progress:  # the elapsed time alone is no change
            self.progress = progress
            self.stream.write(self._meter(sweep) + "\n")
        self.stream.flush()

    def _meter(self, sweep: Sweep) -> str:
        b = sweep["budget"]
        meter = tqdm.format_meter(
            b["ended"],
            b["trials"],
            time.monotonic() - self.started,
            ncols=100,
            prefix=f"sweep {sweep['id'][:8]}",
            unit="trial",
            ascii=True,
            postfix=budget_postfix(sweep),
        )
        return f"{meter}  waiting: {sweep['waiting']}" if sweep["waiting"] else meter


def _trial_line(header: list[str], row: list[str]) -> str:
    """`trial 1  pruned  lr=2e-06  test_accuracy=0.1133  epochs=1`"""
    named = [f"{h}={c}" for h, c in zip(header[2:], row[2:], strict=True)]
    return "  ".join([f"trial {row[0]}", row[1], *named])

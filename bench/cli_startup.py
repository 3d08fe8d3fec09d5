"""How long `trainq` takes to start, for the commands that talk to the API.

For `--help` and for each client command's `--help`, the median wall time of `--runs` fresh
`python -m cli <cmd> --help` processes, and the same for a client command that fails at its
first request (the API of a closed port): the whole start-up of a command that runs. The
baseline is `python -c pass` in the same run. `python -X importtime` names the modules that
cost most, by their cumulative import time, for each case.

Prints one JSON object.    python -m bench.cli_startup [--runs 20] [--top 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "python -c pass": ["-c", "pass"],
    "--help": ["-m", "cli", "--help"],
    "submit --help": ["-m", "cli", "submit", "--help"],
    "ls --help": ["-m", "cli", "ls", "--help"],
    "watch --help": ["-m", "cli", "watch", "--help"],
    "cancel --help": ["-m", "cli", "cancel", "--help"],
    "download --help": ["-m", "cli", "download", "--help"],
    "ls (API unreachable)": ["-m", "cli", "ls"],
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env.update(TRAINQ_API_URL="http://127.0.0.1:9", TRAINQ_API_KEY="a-key")
    return env


def wall_times(args: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def top_imports(args: list[str], top: int) -> list[dict[str, Any]]:
    """The top-level imports with the largest cumulative time (python -X importtime)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
    )
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if cumulative.strip().isdigit() and not name.startswith("  "):  # top level only
            rows.append({"module": name.strip(), "cumulative_ms": int(cumulative) / 1000})
    return sorted(rows, key=lambda r: -r["cumulative_ms"])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--top", type=int, default=8)
    opts = parser.parse_args()
    medians = {name: statistics.median(wall_times(args, opts.runs)) for name, args in CASES.items()}
    baseline = medians["python -c pass"]
    result = {
        "runs": opts.runs,
        "baseline_s": round(baseline, 4),
        "cases": {
            name: {
                "median_s": round(median, 4),
                "over_baseline_s": round(median - baseline, 4),
                "top_imports": top_imports(CASES[name], opts.top),
            }
            for name, median in medians.items()
            if name != "python -c pass"
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

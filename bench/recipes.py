"""The two recipes side by side: time and test accuracy on the full MNIST and on
Fashion-MNIST, trained in-process (core.train.train) with nothing but `dataset`, `recipe`
and `seed` in the spec, so each recipe fills the rest. `accurate` (the default) is the
baseline of the same run; the clock covers the whole call (data, training, export and check
of the default three formats).

The data: the verified MNIST and Fashion-MNIST that `trainq data install` places (scripts/setup
installs them into the test cache).

Prints one JSON object.    python -m bench.recipes [--seeds 0] [--datasets mnist,fashion-mnist]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from bench.seed import cpu_description
from bench.trainer import bench_data_dir
from core.spec import JobSpec
from core.train import checker, train


def run(dataset: str, recipe: str, seed: int) -> dict[str, Any]:
    spec = JobSpec.model_validate({"dataset": dataset, "recipe": recipe, "seed": seed})
    started = time.perf_counter()
    result = train(spec, data_dir=bench_data_dir())
    return {
        "seconds": time.perf_counter() - started,
        "test_accuracy": result.test_accuracy,
        "images_per_second": result.images_per_second,
        "epochs": spec.epochs,
        "filled": list(spec.recipe_filled),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0")
    p.add_argument("--datasets", default="mnist,fashion-mnist")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    checker.share()  # as in a worker: one checker for every run's formats
    out: dict[str, Any] = {
        "benchmark": "recipes",
        "cpu": cpu_description(),
        "threads": torch.get_num_threads(),
        "seeds": seeds,
    }
    for dataset in args.datasets.split(","):
        runs = {r: [run(dataset, r, s) for s in seeds] for r in ("fast", "accurate")}
        summary = {
            r: {
                "seconds_median": round(statistics.median(x["seconds"] for x in rs), 1),
                "test_accuracy": [round(x["test_accuracy"], 4) for x in rs],
                "images_per_second_median": round(
                    statistics.median(x["images_per_second"] for x in rs)
                ),
                "epochs": rs[0]["epochs"],
            }
            for r, rs in runs.items()
        }
        summary["fast_time_ratio"] = round(
            summary["fast"]["seconds_median"] / summary["accurate"]["seconds_median"], 3
        )
        out[dataset] = summary
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""`trainq confusion JOB` (an epoch's confusion matrix and per-class accuracy, by class
name) and `trainq predict JOB IMAGE...` (each image's most probable labels). See docs/api.md
("The CLI")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cli.client_cmd import client
from cli.table import aligned

BAR_WIDTH = 20  # characters of a probability bar at 100%


def confusion_command(args: argparse.Namespace) -> int:
    with client(args) as c:
        figures = c.confusion(c.find_job_id(args.job_id), args.epoch)
    print("\n".join(confusion_table(figures)))
    return 0


def confusion_table(figures: dict[str, Any]) -> list[str]:
    """Rows: the true classes; columns: the predicted ones; then each class's count and
    accuracy."""
    names = figures["classes"]
    rows = [["true \\ predicted", *names, "count", "accuracy"]]
    for name, row, count, accuracy in zip(
        names,
        figures["confusion"],
        figures["class_counts"],
        figures["per_class_accuracy"],
        strict=True,
    ):
        shown = "-" if accuracy is None else f"{accuracy:.1%}"
        rows.append([name, *(str(n) for n in row), str(count), shown])
    lines = [f"epoch {figures['epoch']}: test accuracy {figures['test_accuracy']:.2%}"]
    if figures.get("top5_accuracy") is not None:
        lines[0] += f", top-5 {figures['top5_accuracy']:.2%}"
    return [*lines, *aligned(rows)]


def predict_command(args: argparse.Namespace) -> int:
    missing = [str(p) for p in args.images if not p.is_file()]
    if missing:
        print(f"trainq: not an image file: {', '.join(missing)}", file=sys.stderr)
        return 1
    with client(args) as c:
        answer = c.predict(c.find_job_id(args.job_id), list(args.images), args.top)
    for path, prediction in zip(args.images, answer["predictions"], strict=True):
        print("\n".join(prediction_lines(path, prediction)))
    return 0


def prediction_lines(path: Path, prediction: dict[str, Any]) -> list[str]:
    rows = [
        [
            f"  {label['label']}",
            f"{label['probability']:.1%}",
            "#" * round(label["probability"] * BAR_WIDTH),
        ]
        for label in prediction["top"]
    ]
    return [f"{path}: {prediction['label']}", *aligned(rows)]

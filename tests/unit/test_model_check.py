"""`trainq download --check` runs a model the server sent on an input shaped by the server's
run record: only a shape a data set can have is built (cli/model_check.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli.model_check import CHANNELS, MAX_SIDE, MIN_SIDE, UnlikelyShape, image_shape
from core import datasets

ROOT = Path(__file__).resolve().parents[2]


def record(shape: Any) -> dict[str, Any]:
    return {"dataset": {"name": "mnist", "image_shape": shape}}


@pytest.mark.parametrize("shape", [[1, 28, 28], [3, 32, 32], [1, 4, 256], [3, 256, 4]])
def test_a_data_sets_shape_is_built(shape: list[int]) -> None:
    assert image_shape(record(shape)) == tuple(shape)


@pytest.mark.parametrize(
    "shape",
    [
        [1, 100_000, 100_000],  # 40 GB of zeros
        [3, 257, 28],
        [1, 3, 28],
        [2, 28, 28],
        [0, 28, 28],
        [-1, 28, 28],
        [1, 28, 28, 28],
        [1, 28],
        [],
        ["1", 28, 28],
        [1.0, 28, 28],
        [True, 28, 28],
        "1x28x28",
        None,
        {"c": 1},
    ],
    ids=str,
)
def test_any_other_shape_is_refused(shape: Any) -> None:
    with pytest.raises(UnlikelyShape):
        image_shape(record(shape))


@pytest.mark.parametrize("rec", [None, [], {}, {"dataset": None}, {"dataset": []}], ids=str)
def test_a_record_without_a_shape_is_refused(rec: Any) -> None:
    with pytest.raises(UnlikelyShape):
        image_shape(rec)


def test_the_bounds_are_the_data_sets_own() -> None:
    assert (MIN_SIDE, MAX_SIDE) == (datasets.MIN_SIDE, datasets.MAX_SIDE)
    assert CHANNELS == (1, 3)


def test_the_help_says_check_runs_the_model_here() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "download", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "in this process" in text and "server you trust" in text

"""The limits of POST /sweeps' checks (core.sweeps.bounds): a space whose check would run for
hours, a value inside a range that JobSpec refuses, and values that JobSpec reads one way
and the sweep another."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from core.spec import JobSpec
from core.sweeps.bounds import MAX_CORNERS, MAX_REPORTED, bound_problems
from core.sweeps.search import ask
from core.sweeps.spec import Sampler, SweepSpec

REPO = Path(__file__).resolve().parents[2]
BASE = {"epochs": 2, "batch_size": 128, "min_lr": 0, "augment": "none", "ema_decay": None}


def test_the_space_check_is_bounded_in_time() -> None:
    """Numbers mixed with numeric strings ("5" is an integer to JobSpec) once made every value
    of a choice a corner: 64**6 of them, hours of checks for one 2 KB request. Each value is
    now read as JobSpec reads it, so such a choice repeats itself and is refused."""
    script = textwrap.dedent(
        """
        from pydantic import ValidationError
        from core.sweeps.bounds import bound_problems
        from core.sweeps.spec import SweepSpec
        def mixed(lo, n=64):
            vals = list(range(lo, lo + n // 2))
            return vals + [str(v) for v in vals]
        fields = [("epochs", 1), ("conv1_channels", 1), ("conv2_channels", 1), ("hidden", 1),
                  ("seed", 0), ("batch_size", 1)]
        try:
            spec = SweepSpec.model_validate(
                {"space": {f: {"choice": mixed(lo)} for f, lo in fields}, "trials": 1})
        except ValidationError as e:
            assert "at most once" in str(e), e
        else:
            bound_problems(spec)
        """
    )
    try:
        subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, check=True, timeout=20,
            env={"PYTHONPATH": str(REPO)},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the space check ran over 20 s on a 2 KB request")


def test_a_space_of_too_many_corners_is_refused_before_they_are_walked() -> None:
    """Names and flags have few values each, yet eleven of them make 13,824 corners."""
    flags = ["channels_last", "compile", "gradient_checkpointing", "pin_memory"]
    names = {
        "optimizer": ["adamw", "sgd"],
        "scheduler": ["cosine", "onecycle", "none"],
        "amp": ["auto", "bf16", "off"],
        "augment": ["none", "shift", "affine"],
        "priority": ["low", "normal", "high"],
        "data_path": ["device", "dataloader"],
    }
    space = {f: {"choice": [True, False]} for f in flags} | {
        n: {"choice": v} for n, v in names.items()
    }
    (problem,) = bound_problems(SweepSpec.model_validate({"space": space}))
    assert problem["type"] == "space_too_large" and f"{MAX_CORNERS:,}" in problem["msg"]


def test_a_fraction_inside_an_integer_choice_is_refused() -> None:
    """Checked at its ends only, 1.5 between 1 and 2 once passed for the integer `epochs`,
    and a grid queued a trial that its worker then failed."""
    with pytest.raises(ValidationError, match=r"epochs: choice 1\.5"):
        SweepSpec.model_validate(
            {"base": BASE, "space": {"epochs": {"choice": [1, 1.5, 2]}}, "trials": 3}
        )
    # Within the type but outside the field's bounds: refused with where it fails.
    spec = SweepSpec.model_validate({"space": {"epochs": {"choice": [1, 500, 2]}}})
    (problem,) = bound_problems(spec)
    assert problem["loc"] == ["body", "space", "epochs", "choice"] and problem["input"] == 500


@pytest.mark.parametrize(
    "space",
    [
        {"epochs": "5", "lr": {"choice": [1e-3, 2e-3]}},  # a fixed value
        {"epochs": {"choice": ["3", 2]}},  # a choice
    ],
)
def test_values_are_read_as_jobspec_reads_them(space: dict[str, Any]) -> None:
    """JobSpec reads "5" as 5: so do the sweep's pruner (hyperband's budget is the most
    epochs, once int("5.0"): a 500) and its trials."""
    spec = SweepSpec.model_validate(
        {"base": BASE, "space": space, "pruner": {"name": "hyperband"}, "trials": 2}
    )
    assert bound_problems(spec) == []
    params = ask(spec, "s", [], 0).params
    assert spec.trial_spec(params).epochs in (2, 3, 5)
    assert all(not isinstance(v, str) for v in params.values())


def test_the_same_value_twice_is_refused() -> None:
    for choice in ([1, 1.0], ["0.001", 0.001]):
        with pytest.raises(ValidationError, match="at most once"):
            field = "epochs" if choice[0] == 1 else "lr"
            SweepSpec.model_validate({"space": {field: {"choice": choice}}})


def only_hidden_128(spec: JobSpec) -> str | None:
    """A start that only a cnn of hidden 128 can take, as init_from's rules ask one value."""
    return None if spec.hidden == 128 else f"set hidden 128, not {spec.hidden}"


def test_a_grid_is_checked_at_every_point_and_each_refused_trial_named() -> None:
    grid = SweepSpec.model_validate(
        {
            "base": BASE, "sampler": {"name": "grid"}, "trials": 2,
            "space": {"hidden": {"choice": [128, 64, 256]}, "lr": {"choice": [1e-3, 2e-3, 3e-3]}},
        }
    )  # fmt: skip
    problems = bound_problems(grid, start=only_hidden_128)
    assert [p["msg"].split(" the trial")[0] for p in problems] == [
        f"at hidden={h}, lr={lr}" for h in (64, 256) for lr in (0.001, 0.002, 0.003)
    ]
    assert all(p["type"] == "init_from" and p["loc"] == ["body", "space"] for p in problems)
    assert problems[0]["msg"].endswith("cannot start from its init_from: set hidden 128, not 64")
    # Searched by TPE: its corners (the ends of each numeric choice) alone, lr 0.002 not.
    corners = bound_problems(grid.model_copy(update={"sampler": Sampler()}), start=only_hidden_128)
    assert [p["msg"].split(" the trial")[0] for p in corners] == [
        f"at hidden={h}, lr={lr}" for h in (64, 256) for lr in (0.001, 0.003)
    ]


def test_a_refusal_names_a_few_trials_and_counts_the_rest() -> None:
    widths = list(range(1, 65))
    grid = SweepSpec.model_validate(
        {"base": BASE, "sampler": {"name": "grid"}, "space": {"hidden": {"choice": widths}}}
    )
    problems = bound_problems(grid, start=only_hidden_128)
    assert len(problems) == MAX_REPORTED
    assert problems[-1]["msg"].endswith(f"(and {64 - MAX_REPORTED} more of the trials checked)")

"""Recipes (core.recipes): defaults for the knobs a spec leaves out, named in the spec."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.recipes import KNOBS, RECIPES, Recipe
from core.spec import JobSpec, Scheduler, stored_spec
from core.sweeps.spec import SweepSpec


def test_accurate_is_the_default_and_the_fields_own_defaults() -> None:
    spec = JobSpec()
    assert spec.recipe is Recipe.accurate
    assert spec.recipe_filled == KNOBS
    for knob, value in RECIPES[Recipe.accurate].items():
        assert JobSpec.model_fields[knob].default == value == getattr(spec, knob)


def test_fast_fills_only_what_the_spec_leaves_out_and_names_it() -> None:
    spec = JobSpec.model_validate({"recipe": "fast", "lr": 0.02, "epochs": 2})
    assert (spec.lr, spec.epochs) == (0.02, 2)  # given: kept
    assert spec.batch_size == 256 and spec.scheduler is Scheduler.onecycle
    assert spec.ema_decay is None and spec.augment == "none"
    assert set(spec.recipe_filled) == set(KNOBS) - {"lr", "epochs"}
    given_as_the_recipe_has_it = JobSpec.model_validate({"recipe": "fast", "batch_size": 256})
    assert "batch_size" not in given_as_the_recipe_has_it.recipe_filled


def test_a_stored_spec_reads_back_the_same_and_a_false_record_is_refused() -> None:
    spec = JobSpec.model_validate({"recipe": "fast", "lr": 0.02})
    stored = spec.model_dump(mode="json")
    assert stored_spec(stored) == spec
    with pytest.raises(ValidationError, match="batch_size is not the fast recipe's 256"):
        JobSpec.model_validate({**stored, "batch_size": 32})
    with pytest.raises(ValidationError, match="no knob a recipe sets"):
        JobSpec.model_validate({**stored, "recipe_filled": ["seed"]})
    with pytest.raises(ValidationError, match="recipe"):
        JobSpec.model_validate({"recipe": "fastest"})


def test_a_spec_stored_before_recipes_reads_as_accurate_with_nothing_filled() -> None:
    old = JobSpec().model_dump(mode="json")
    del old["recipe"], old["recipe_filled"]
    spec = stored_spec(old)
    assert spec.recipe is Recipe.accurate and spec.recipe_filled == ()
    assert spec.model_dump(exclude={"recipe_filled"}) == JobSpec().model_dump(
        exclude={"recipe_filled"}
    )


def test_a_sweeps_trials_take_their_own_recipe_for_what_the_base_left_out() -> None:
    sweep = SweepSpec.model_validate(
        {
            "base": {"recipe": "fast", "epochs": 1},
            "space": {"lr": {"choice": [0.005, 0.02]}, "recipe": {"choice": ["fast", "accurate"]}},
            "trials": 4,
        }
    )
    fast = sweep.trial_spec({"lr": 0.005, "recipe": "fast"})
    assert (fast.lr, fast.batch_size, fast.epochs) == (0.005, 256, 1)
    assert "lr" not in fast.recipe_filled and "epochs" not in fast.recipe_filled
    accurate = sweep.trial_spec({"lr": 0.02, "recipe": "accurate"})
    assert (accurate.lr, accurate.batch_size, accurate.epochs) == (0.02, 64, 1)
    assert accurate.ema_decay == 0.999 and "batch_size" in accurate.recipe_filled


def test_a_sweep_cannot_search_what_the_recipe_filled() -> None:
    with pytest.raises(ValidationError, match="recipe_filled belongs in base"):
        SweepSpec.model_validate({"space": {"recipe_filled": {"choice": ["lr", "seed"]}}})


@pytest.mark.parametrize(
    ("base", "space", "most"),
    [
        ({"recipe": "fast"}, {"recipe": {"choice": ["fast", "accurate"]}}, 8),
        ({"recipe": "fast"}, {"recipe": "accurate"}, 8),
        ({}, {"recipe": "fast"}, 1),
        ({"recipe": "fast", "epochs": 3}, {"recipe": {"choice": ["fast", "accurate"]}}, 3),
        ({"recipe": "fast"}, {"recipe": "accurate", "epochs": 2}, 2),
    ],
)
def test_a_sweeps_epoch_budget_is_its_trials_epochs(
    base: dict[str, object], space: dict[str, object], most: int
) -> None:
    lr = {"lr": {"choice": [0.005, 0.02]}}
    sweep = SweepSpec.model_validate({"base": base, "space": {**lr, **space}, "trials": 2})
    assert sweep.max_epochs == most
    recipes = space["recipe"]
    for recipe in recipes["choice"] if isinstance(recipes, dict) else [None]:
        params = {"lr": 0.005} | ({"recipe": recipe} if recipe else {})
        assert sweep.trial_spec(params).epochs <= most


def test_a_trial_jobspec_refuses_is_stored_with_its_recipe_filled_in() -> None:
    from core.db import Sweep
    from core.sweeps.trials import _trial_job

    sweep = SweepSpec.model_validate({"space": {"lr": {"log_uniform": [1e-4, 1e-2]}}})
    row = Sweep(id="s", owner="o", name=None, tags=None)
    job = _trial_job(row, sweep, 0, {"lr": 100.0}, {})  # past lr's bound: refused
    assert job.spec["lr"] == 100.0
    assert {k: job.spec[k] for k in KNOBS if k != "lr"} == {
        k: v for k, v in RECIPES[Recipe.accurate].items() if k != "lr"
    }
    assert sorted(job.spec["recipe_filled"]) == sorted(set(KNOBS) - {"lr"})


def test_a_knob_named_twice_in_recipe_filled_is_refused_as_such() -> None:
    for filled in (["epochs", "epochs"], ["lr", "epochs", "lr"]):
        with pytest.raises(ValidationError, match="each knob at most once"):
            JobSpec.model_validate({"recipe": "fast", "recipe_filled": filled})

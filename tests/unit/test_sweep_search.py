"""The sweep request (core.sweeps.spec) and the search over stored trials
(core.sweeps.search): forms, bounds against JobSpec, seeded asks, a grid that visits each
point once, and a pruner whose state survives a replay."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from core.spec import JobSpec
from core.sweeps.bounds import bound_problems
from core.sweeps.search import Phase, TrialRecord, ask, judge
from core.sweeps.spec import SweepSpec


def spec(**fields: Any) -> SweepSpec:
    return SweepSpec.model_validate({"space": {"lr": {"log_uniform": [1e-4, 1e-2]}}, **fields})


@pytest.mark.parametrize(
    "space",
    [
        {"lr": {"log_uniform": [1e-2, 1e-4]}},  # low above high
        {"lr": {"log_uniform": [0, 1e-2]}},  # log of zero
        {"lr": {}},  # no form
        {"lr": {"uniform": [0.1, 0.2], "choice": [0.1]}},  # two forms
        {"lr": {"choice": [0.1, 0.1]}},  # a choice twice
        {"epochs": {"uniform": [1, 5]}},  # a fraction for an integer
        {"optimizer": {"uniform": [0, 1]}},  # numbers for names
        {"no_such_field": {"choice": [1, 2]}},
        {"dataset": {"choice": ["mnist", "mnist-sample"]}},
        {"epochs": 3},  # nothing to search
    ],
)
def test_malformed_spaces_are_refused(space: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SweepSpec.model_validate({"space": space})


def test_a_grid_needs_choices_and_room() -> None:
    with pytest.raises(ValidationError, match="every dimension must be a choice"):
        spec(sampler={"name": "grid"})
    with pytest.raises(ValidationError, match="exceed the grid"):
        SweepSpec.model_validate(
            {"space": {"lr": {"choice": [0.1, 0.01]}}, "sampler": {"name": "grid"}, "trials": 3}
        )


def test_bounds_are_checked_against_jobspec_alone_and_at_the_corners() -> None:
    assert bound_problems(spec()) == []
    (alone,) = bound_problems(spec(space={"lr": {"log_uniform": [1e-4, 20]}}))
    assert alone["loc"] == ["body", "space", "lr", "log_uniform"] and alone["input"] == 20
    # Each bound passes alone; together with min_lr above lr, the cosine schedule refuses.
    (corner,) = bound_problems(
        spec(space={"lr": {"log_uniform": [1e-6, 1e-2]}, "min_lr": {"uniform": [0, 1e-5]}})
    )
    assert corner["loc"] == ["body", "space"] and "min_lr" in corner["msg"]
    # A model too large only where two widths are both at their top.
    wide = {"hidden": {"int_uniform": [16, 8192]}, "conv3_channels": {"int_uniform": [8, 2048]}}
    assert bound_problems(spec(space=wide))[0]["type"] == "space_outside_jobspec"


def test_the_trial_spec_is_base_then_fixed_then_params() -> None:
    s = spec(base={"epochs": 3, "batch_size": 32}, space={"lr": {"choice": [0.1]}, "epochs": 5})
    trial = s.trial_spec({"lr": 0.1})
    assert trial == JobSpec(epochs=5, batch_size=32, lr=0.1)
    assert s.max_epochs == 5


def records(asks: list[tuple[dict[str, Any], dict[str, Any]]], value: float) -> list[TrialRecord]:
    return [
        TrialRecord(n, Phase.complete, params, attrs, {1: value + n / 100})
        for n, (params, attrs) in enumerate(asks)
    ]


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_the_same_history_asks_the_same(sampler: str) -> None:
    s = spec(sampler={"name": sampler, "seed": 7, "startup_trials": 2})
    history: list[TrialRecord] = []
    for n in range(5):
        first, again = ask(s, "sweep", history, n), ask(s, "sweep", history, n)
        assert first == again
        history.append(TrialRecord(n, Phase.complete, first.params, first.attrs, {1: 0.5 + n}))
    other = spec(sampler={"name": sampler, "seed": 8, "startup_trials": 2})
    assert ask(other, "sweep", [], 0).params != ask(s, "sweep", [], 0).params


def test_a_grid_visits_each_point_once_across_replays() -> None:
    choices = [3e-3, 1e-6, 2e-6, 5e-4]
    for seed in range(4):
        s = SweepSpec.model_validate(
            {
                "space": {"lr": {"choice": choices}},
                "sampler": {"name": "grid", "seed": seed},
                "trials": 4,
            }
        )
        history: list[TrialRecord] = []
        for n in range(4):
            asked = ask(s, "sweep", history, n)
            history.append(TrialRecord(n, Phase.running, asked.params, asked.attrs))
        assert sorted(t.params["lr"] for t in history) == sorted(choices)


def test_asha_remembers_rungs_through_the_stored_attrs() -> None:
    """A trial's completed rung is stored with it: without it, a replay forgets that the
    leaders ever reached the rung, and a poor trial sails through."""
    s = spec(pruner={"name": "asha", "min_epochs": 1, "reduction_factor": 2}, trials=8)
    leaders = [
        TrialRecord(n, Phase.complete, {"lr": 1e-3}, {}, {1: 0.9, 2: 0.95}) for n in range(3)
    ]
    judged_leaders: list[TrialRecord] = []
    for t in leaders:  # each judged at its epoch 1, as its worker does
        at_one = TrialRecord(t.number, Phase.running, t.params, {}, {1: t.values[1]})
        v = judge(s, "sweep", [*judged_leaders, at_one], t.number)
        assert not v.prune
        judged_leaders.append(TrialRecord(t.number, Phase.complete, t.params, v.attrs, t.values))
    poor = TrialRecord(3, Phase.running, {"lr": 1e-4}, {}, {1: 0.1})
    assert judge(s, "sweep", [*judged_leaders, poor], 3).prune
    forgetful = [TrialRecord(t.number, t.state, t.params, {}, t.values) for t in judged_leaders]
    assert not judge(s, "sweep", [*forgetful, poor], 3).prune


def test_no_pruner_never_prunes() -> None:
    s = spec(pruner={"name": "none"})
    history = [TrialRecord(0, Phase.complete, {"lr": 1e-3}, {}, {1: 0.99})]
    poor = TrialRecord(1, Phase.running, {"lr": 1e-4}, {}, {1: 0.01})
    assert not judge(s, "sweep", [*history, poor], 1).prune


def test_neighbouring_seeds_draw_unrelated_points() -> None:
    """Seeded s + n, the sweeps of seeds 0 and 1 drew the same points, one trial apart."""
    draws = {}
    for seed in (0, 1):
        s = spec(sampler={"name": "random", "seed": seed}, trials=8)
        history: list[TrialRecord] = []
        for n in range(6):
            asked = ask(s, "sweep", history, n)
            history.append(TrialRecord(n, Phase.complete, asked.params, asked.attrs, {1: 0.5}))
        draws[seed] = [t.params["lr"] for t in history]
    assert not set(draws[0]) & set(draws[1])

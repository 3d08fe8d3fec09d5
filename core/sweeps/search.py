"""The search: Optuna's samplers and pruners, asked over a sweep's trials as the database
holds them. Each decision replays the trials into an in-memory study and asks it once; what
a sampler or pruner keeps on a trial is handed back to be stored with it, and the sampler
is seeded per trial (`trial_seed`), so a decision lost to a crash is made again the same
way. See docs/sweeps.md ("Where the search lives")."""

from __future__ import annotations

import hashlib
import logging
import warnings
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState, create_trial

from core.sweeps.spec import Dimension, PrunerName, SamplerName, SweepSpec

optuna.logging.set_verbosity(logging.WARNING)
optuna.logging.disable_propagation()


class Phase(StrEnum):
    """A trial as the search sees it, from its job's status."""

    running = "running"  # queued or running: its values so far
    complete = "complete"
    pruned = "pruned"
    failed = "failed"  # failed or canceled: no value, its point taken


@dataclass(frozen=True)
class TrialRecord:
    number: int
    state: Phase
    params: dict[str, Any]
    attrs: dict[str, Any] = field(default_factory=dict)  # Optuna's system attributes
    values: dict[int, float] = field(default_factory=dict)  # the objective at each epoch's end


@dataclass(frozen=True)
class Asked:
    params: dict[str, Any]
    attrs: dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    prune: bool
    attrs: dict[str, Any]


def distributions(spec: SweepSpec) -> dict[str, BaseDistribution]:
    return {name: _distribution(dim) for name, dim in spec.dimensions.items()}


def _distribution(dim: Dimension) -> BaseDistribution:
    if dim.choice is not None:
        return CategoricalDistribution(dim.choice)
    low, high = dim.bounds
    if dim.form in ("uniform", "log_uniform"):
        return FloatDistribution(low, high, log=dim.form == "log_uniform")
    return IntDistribution(low, high, log=dim.form == "log_int_uniform")


def startup_trials(spec: SweepSpec) -> int:
    if spec.sampler.startup_trials is not None:
        return spec.sampler.startup_trials
    return max(2, min(10, spec.trials // 4))


def trial_seed(seed: int, number: int) -> int:
    """The sampler's seed for trial `number`: a hash of both, so that the sweeps seeded s and
    s + 1 draw unrelated points (with s + n they would draw the same ones, one trial apart)."""
    digest = hashlib.sha256(f"{seed}:{number}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _sampler(spec: SweepSpec, number: int) -> optuna.samplers.BaseSampler:
    seed = trial_seed(spec.sampler.seed, number)
    if spec.sampler.name is SamplerName.random:
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler.name is SamplerName.grid:
        # The sweep's seed alone: the sampler shuffles its grid with it, and a grid point
        # stored on a trial must name the same values at every replay.
        grid = {name: list(dim.choice or ()) for name, dim in spec.dimensions.items()}
        return optuna.samplers.GridSampler(grid, seed=spec.sampler.seed)
    # constant_liar: the trials in flight count as if they had done badly, so parallel
    # trials are not all asked into one spot.
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=startup_trials(spec), constant_liar=True
    )


def _pruner(spec: SweepSpec) -> optuna.pruners.BasePruner:
    p = spec.pruner
    if p.name is PrunerName.asha:
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=p.min_epochs, reduction_factor=p.reduction_factor
        )
    if p.name is PrunerName.hyperband:
        return optuna.pruners.HyperbandPruner(
            min_resource=p.min_epochs,
            max_resource=max(spec.max_epochs, p.min_epochs),
            reduction_factor=p.reduction_factor,
        )
    if p.name is PrunerName.median:
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=p.min_epochs - 1)
    return optuna.pruners.NopPruner()


def _study(spec: SweepSpec, name: str, number: int) -> optuna.Study:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.create_study(
            study_name=name,
            direction=spec.objective.goal.value,
            sampler=_sampler(spec, number),
            pruner=_pruner(spec),
        )


def _frozen(t: TrialRecord, dists: dict[str, BaseDistribution]) -> FrozenTrial:
    state = {
        Phase.running: TrialState.RUNNING,
        Phase.complete: TrialState.COMPLETE,
        Phase.pruned: TrialState.PRUNED,
        Phase.failed: TrialState.FAIL,
    }[t.state]
    value = None
    if state is TrialState.COMPLETE:
        if not t.values:  # ended without an epoch's record: nothing to learn from
            state = TrialState.FAIL
        else:
            value = t.values[max(t.values)]
    params = {k: v for k, v in t.params.items() if k in dists}
    return create_trial(
        state=state,
        value=value,
        params=params,
        distributions={k: dists[k] for k in params},
        system_attrs=dict(t.attrs),
        intermediate_values=dict(t.values),
    )


def _replayed(spec: SweepSpec, name: str, trials: list[TrialRecord], number: int) -> optuna.Study:
    study = _study(spec, name, number)
    dists = distributions(spec)
    for t in sorted(trials, key=lambda t: t.number):
        study.add_trial(_frozen(t, dists))
    return study


def ask(spec: SweepSpec, name: str, trials: list[TrialRecord], number: int) -> Asked:
    """The values of trial `number`, given the trials before it."""
    study = _replayed(spec, name, trials, number)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        trial = study.ask(distributions(spec))
    return Asked(params=dict(trial.params), attrs=_attrs(study, trial._trial_id))


def judge(spec: SweepSpec, name: str, trials: list[TrialRecord], number: int) -> Verdict:
    """Whether trial `number`, running with the values its record holds, should stop now."""
    study = _replayed(spec, name, trials, number)
    frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == _index(trials, number))
    prune = study.pruner.prune(study, frozen)
    return Verdict(prune=bool(prune), attrs=_attrs(study, frozen._trial_id))


def _index(trials: list[TrialRecord], number: int) -> int:
    """Where trial `number` sits in the replayed study (numbers may have gaps: a deleted job)."""
    return sorted(t.number for t in trials).index(number)


def _attrs(study: optuna.Study, trial_id: int) -> dict[str, Any]:
    # Optuna's own pruners write through the study's storage; so is the trial read back.
    return dict(study._storage.get_trial(trial_id).system_attrs)

"""`SweepSpec`: one experiment of many trials. A base JobSpec, a search space over JobSpec's
own fields, an objective read from the epoch record, and the Optuna sampler and pruner that
choose and stop trials. Every trial is an ordinary job whose spec is the base with the
trial's values; core.sweeps.bounds refuses a space that could sample a spec POST /jobs
would refuse. See docs/sweeps.md."""

from __future__ import annotations

import functools
import json
import types
from enum import StrEnum
from typing import Annotated, Any, Union, cast, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from core.recipes import RECIPES, Recipe
from core.spec import JobSpec

MAX_DIMENSIONS = 12
MAX_CHOICES = 64
MAX_TRIALS = 500
MAX_PARALLEL = 64
# Set in the base only, where they are checked as POST /jobs checks them (an uploaded set
# must be the key's own): a trial's data set is the base's, since one objective over
# different data would compare nothing; the formats are a tuple, not a value to search.
NOT_SEARCHED = frozenset({"dataset", "export", "recipe_filled"})  # the last is trainq's to set

Scalar = bool | int | float | str | None


class Dimension(BaseModel):
    """One searched field: exactly one of the five forms."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    uniform: tuple[float, float] | None = Field(None, description="[low, high], floats.")
    log_uniform: tuple[float, float] | None = Field(
        None, description="[low, high], floats drawn evenly in log space; low > 0."
    )
    int_uniform: tuple[int, int] | None = Field(None, description="[low, high], integers.")
    log_int_uniform: tuple[int, int] | None = Field(
        None, description="[low, high], integers drawn evenly in log space; low >= 1."
    )
    choice: list[Scalar] | None = Field(
        None, min_length=1, max_length=MAX_CHOICES, description="The values to choose from."
    )

    @model_validator(mode="after")
    def _one_form(self) -> Dimension:
        forms = [k for k in type(self).model_fields if getattr(self, k) is not None]
        if len(forms) != 1:
            raise ValueError(
                "give exactly one of uniform, log_uniform, int_uniform, log_int_uniform, "
                f"choice (got {', '.join(forms) or 'none'})"
            )
        if self.choice is not None:
            if len({repr(v) for v in self.choice}) != len(self.choice):
                raise ValueError("each choice at most once")
            return self
        low, high = self.bounds
        if low > high:
            raise ValueError(f"low {low} is above high {high}")
        if (self.log_uniform or self.log_int_uniform) and low <= 0:
            raise ValueError(f"a log scale needs low > 0 (got {low})")
        return self

    @property
    def form(self) -> str:
        return next(k for k in type(self).model_fields if getattr(self, k) is not None)

    @property
    def bounds(self) -> tuple[Any, Any]:
        value = getattr(self, self.form)
        return value[0], value[-1]

    def extremes(self) -> list[Scalar]:
        """The values a corner of the space takes here: the bounds of a range, or of numeric
        choices; every value of other choices."""
        if self.choice is None:
            return list(dict.fromkeys(self.bounds))
        numbers = [v for v in self.choice if isinstance(v, int | float) and not isinstance(v, bool)]
        others = [v for v in self.choice if v not in numbers or isinstance(v, bool)]
        ends = [min(numbers), max(numbers)] if numbers else []
        return list(dict.fromkeys([*ends, *others]))


class Direction(StrEnum):
    maximize = "maximize"
    minimize = "minimize"


class Metric(StrEnum):
    """What a trial is judged by: a field of its epoch record."""

    test_accuracy = "test_accuracy"
    test_loss = "test_loss"
    train_accuracy = "train_accuracy"
    train_loss = "train_loss"

    @property
    def natural(self) -> Direction:
        return Direction.maximize if self.name.endswith("accuracy") else Direction.minimize


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: Metric = Field(Metric.test_accuracy, description="Read at each epoch's end.")
    direction: Direction | None = Field(
        None, description="maximize or minimize; by default, what the metric asks for."
    )

    @property
    def goal(self) -> Direction:
        return self.direction or self.metric.natural


class SamplerName(StrEnum):
    tpe = "tpe"
    random = "random"
    grid = "grid"


class Sampler(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: SamplerName = Field(SamplerName.tpe, description="Optuna's TPE, random, or grid.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="The same seed and history ask alike.")
    startup_trials: int | None = Field(
        None,
        ge=0,
        le=MAX_TRIALS,
        description="TPE: trials drawn at random before it models the space (default: a "
        "quarter of the budget, between 2 and 10).",
    )


class PrunerName(StrEnum):
    asha = "asha"  # Optuna's SuccessiveHalvingPruner: asynchronous successive halving
    hyperband = "hyperband"
    median = "median"
    none = "none"


class Pruner(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: PrunerName = Field(PrunerName.asha, description="asha, hyperband, median or none.")
    min_epochs: int = Field(
        1, ge=1, le=200, description="Epochs every trial trains before it can be pruned."
    )
    reduction_factor: int = Field(
        3, ge=2, le=10, description="asha, hyperband: about 1 in this many trials go on at a rung."
    )


class SweepSpec(BaseModel):
    """A search over JobSpec's fields. Unknown fields, NaN and infinities are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    base: JobSpec = Field(default_factory=JobSpec, description="The job every trial starts from.")
    space: dict[str, Dimension | Scalar] = Field(
        min_length=1,
        description="JobSpec fields: a search dimension ({uniform|log_uniform|int_uniform|"
        "log_int_uniform: [low, high]} or {choice: [...]}), or a plain value fixed for every "
        "trial.",
        examples=[{"lr": {"log_uniform": [1e-4, 1e-2]}, "batch_size": {"choice": [64, 128, 256]}}],
    )
    objective: Objective = Field(default_factory=Objective)
    sampler: Sampler = Field(default_factory=Sampler)
    pruner: Pruner = Field(default_factory=Pruner)
    trials: int = Field(16, ge=1, le=MAX_TRIALS, description="The budget: trials in all.")
    parallel: int = Field(2, ge=1, le=MAX_PARALLEL, description="Trials queued or running at once.")

    @field_validator("space")
    @classmethod
    def _searchable(cls, space: dict[str, Dimension | Scalar]) -> dict[str, Dimension | Scalar]:
        unknown = sorted(set(space) - set(JobSpec.model_fields))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not JobSpec fields")
        dims = {k: v for k, v in space.items() if isinstance(v, Dimension)}
        named = sorted(set(space) & NOT_SEARCHED)
        if named:
            raise ValueError(f"{', '.join(named)} belongs in base, not in the space")
        if not dims:
            raise ValueError("no dimension to search (only fixed values)")
        if len(dims) > MAX_DIMENSIONS:
            raise ValueError(f"at most {MAX_DIMENSIONS} dimensions")
        for name, dim in dims.items():
            problem = _form_problem(name, dim)
            if problem:
                raise ValueError(f"{name}: {problem}")
        # Every value as JobSpec reads it ("5" is 5 to an integer field): what the search
        # samples, the corners checked and the trials' specs then agree.
        return {name: _as_jobspec_reads(name, value) for name, value in space.items()}

    @model_validator(mode="after")
    def _grid_fits(self) -> SweepSpec:
        if self.sampler.name is SamplerName.grid:
            if any(d.choice is None for d in self.dimensions.values()):
                raise ValueError("sampler grid: every dimension must be a choice")
            if self.trials > self.grid_size:
                raise ValueError(f"trials {self.trials} exceed the grid's {self.grid_size} points")
        return self

    @property
    def dimensions(self) -> dict[str, Dimension]:
        return {k: v for k, v in self.space.items() if isinstance(v, Dimension)}

    @property
    def fixed(self) -> dict[str, Scalar]:
        return {k: v for k, v in self.space.items() if not isinstance(v, Dimension)}

    @property
    def grid_size(self) -> int:
        size = 1
        for d in self.dimensions.values():
            size *= len(d.choice or ())
        return size

    @property
    def max_epochs(self) -> int:
        """The most epochs a trial may train: a pruner's full budget."""
        return max(int(v) for v in self._values_of("epochs"))

    def _values_of(self, field: str) -> list[Any]:
        """The values a trial's `field` may take at a corner of the space. A knob the base
        left to its recipe is each trial's recipe's (trial_spec), not the base's."""
        dim = self.dimensions.get(field)
        if dim is not None:
            return [v for v in dim.extremes() if v is not None]
        if field in self.fixed:
            return [self.fixed[field]]
        if field in self.base.recipe_filled:
            return [RECIPES[Recipe(r)][field] for r in self._values_of("recipe")]
        return [getattr(self.base, field)]

    def trial_spec(self, params: dict[str, Any]) -> JobSpec:
        """The job of a trial: the base, the fixed values, then the trial's own."""
        return JobSpec.model_validate({**self.base.submitted(), **self.fixed, **params})


def _as_jobspec_reads(name: str, value: Dimension | Scalar) -> Dimension | Scalar:
    """The value (or each choice) in the type of JobSpec's field; its bounds are left to
    bound_problems, which names where they fail."""
    adapter = _type_of(name)

    def read(v: Scalar, what: str) -> Scalar:
        try:
            return cast(Scalar, adapter.dump_python(adapter.validate_python(v), mode="json"))
        except ValidationError as e:
            raise ValueError(f"{name}: {what} {v!r}: {e.errors()[0]['msg']}") from e

    if not isinstance(value, Dimension):
        return read(value, "value")
    if value.choice is None:
        return value
    choices = [read(v, "choice") for v in value.choice]
    if len({json.dumps(v) for v in choices}) != len(choices):
        raise ValueError(f"{name}: each choice at most once (as {name} reads them: {choices})")
    return Dimension(choice=choices)


@functools.cache
def _type_of(name: str) -> TypeAdapter[Any]:
    return TypeAdapter(cast(Any, JobSpec.model_fields[name].annotation))


def _form_problem(name: str, dim: Dimension) -> str | None:
    """A range whose form does not fit the field's type (a fraction for an integer field,
    numbers for a choice of names)."""
    kind = _field_kind(name)
    if dim.choice is not None:
        return None
    if kind == "int" and dim.form in ("uniform", "log_uniform"):
        return f"{name} is an integer: use int_uniform or log_int_uniform"
    if kind == "other":
        return f"{name} is not a number: use choice"
    return None


def _field_kind(name: str) -> str:
    """ "int", "float" or "other" (enums, booleans, text) for a JobSpec field."""
    annotation = JobSpec.model_fields[name].annotation
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if annotation is bool:
        return "other"
    if annotation is int:
        return "int"
    return "float" if annotation is float else "other"

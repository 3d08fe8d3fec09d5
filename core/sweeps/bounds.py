"""Where a sweep's space could make a trial that POST /jobs would refuse: each value alone
against the base, then the trials together (every point of a grid, else every corner),
each refusal naming the trial's values. See docs/sweeps.md."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import ValidationError

from core.model_sizes import model_too_large
from core.spec import JobSpec
from core.sweeps.spec import SamplerName, SweepSpec

MAX_CORNERS = 4096  # the corners of the space checked against JobSpec, each a validation
MAX_REPORTED = 8  # the trials a refusal names (and how many more it found)


def bound_problems(
    spec: SweepSpec,
    images: tuple[tuple[int, int, int], int] | None = None,
    start: Callable[[JobSpec], str | None] | None = None,
) -> list[dict[str, Any]]:
    """Where the space could sample a spec that JobSpec refuses, shaped like FastAPI's 422
    details (`loc` names the field): each value alone against the base first, then the
    trials together (a cross-field rule such as min_lr <= lr), each naming its values.
    `images`, the (C, H, W) shape and classes of the base's uploaded set: each trial's model
    must fit it, as POST /jobs checks. `start`: why a trial's spec may not start from its
    init_from, as POST /jobs checks it (api.access.Starts)."""
    base = {**spec.base.submitted(), **spec.fixed}
    problems = _alone(spec, base)
    if problems:
        return problems
    points = _trials_to_check(spec)
    if points is None:
        return [
            {
                "loc": ["body", "space"],
                "msg": f"the space has {_corners(spec):,} corners to check against JobSpec "
                f"(each range's ends, each numeric choice's ends, every other choice): at "
                f"most {MAX_CORNERS:,}; search fewer names and flags at once",
                "type": "space_too_large",
            }
        ]
    refused: list[dict[str, Any]] = []
    for values in points:
        problem = _trial_problem({**base, **values}, images, start)
        if problem is not None:
            at = ", ".join(f"{k}={v!r}" for k, v in values.items())
            msg, kind = problem
            refused.append({"loc": ["body", "space"], "msg": f"at {at} {msg}", "type": kind})
    if len(refused) > MAX_REPORTED:
        more = len(refused) - MAX_REPORTED
        refused[MAX_REPORTED - 1]["msg"] += f" (and {more} more of the trials checked)"
    return refused[:MAX_REPORTED]


def _corners(spec: SweepSpec) -> int:
    return math.prod(len(d.extremes()) for d in spec.dimensions.values())


def _trials_to_check(spec: SweepSpec) -> Iterator[dict[str, Any]] | None:
    """The values of the trials to check: every point of a grid of at most MAX_CORNERS, else
    every corner of the space (each rule's worst case lies at one: the cost of a model grows
    with each width and the batch, and init_from's rules ask for one value); None past
    MAX_CORNERS corners."""
    dims = spec.dimensions
    if spec.sampler.name is SamplerName.grid and spec.grid_size <= MAX_CORNERS:
        axes = [d.choice or [] for d in dims.values()]
    elif _corners(spec) <= MAX_CORNERS:
        axes = [d.extremes() for d in dims.values()]
    else:
        return None
    return (dict(zip(dims, point, strict=True)) for point in itertools.product(*axes))


def _trial_problem(
    values: dict[str, Any],
    images: tuple[tuple[int, int, int], int] | None,
    start: Callable[[JobSpec], str | None] | None,
) -> tuple[str, str] | None:
    """Why a trial of these values would be refused, and the kind of refusal; or None."""
    try:
        trial = JobSpec.model_validate(values)
    except ValidationError as e:
        msg = "; ".join(err["msg"] for err in e.errors())
        return f"the trial's spec is refused: {msg}", "space_outside_jobspec"
    too_large = images and model_too_large(trial, *images)
    if too_large:
        return f"the trial's model is too large: {too_large}", "model_too_large"
    cannot_start = start and start(trial)
    if cannot_start:
        return f"the trial cannot start from its init_from: {cannot_start}", "init_from"
    return None


def _alone(spec: SweepSpec, base: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        JobSpec.model_validate(base)
    except ValidationError as e:
        return [
            {
                "loc": ["body", "space", *map(str, err["loc"])],
                "msg": err["msg"],
                "type": err["type"],
            }
            for err in e.errors()
        ]
    problems = []
    for name, dim in spec.dimensions.items():
        for value in dim.choice if dim.choice is not None else dim.extremes():
            try:
                JobSpec.model_validate({**base, name: value})
            except ValidationError as e:
                own = [err for err in e.errors() if tuple(err["loc"][:1]) == (name,)]
                if own:
                    problems.append(
                        {
                            "loc": ["body", "space", name, dim.form],
                            "msg": f"{value!r} is outside JobSpec's {name}: {own[0]['msg']}",
                            "type": "space_outside_jobspec",
                            "input": value,
                        }
                    )
                    break
    return problems

"""Validation problems as a person reads them (core/field_errors.py): no pydantic prefix,
and a misspelt field named with the one it was probably meant to be, at any depth."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from core.errors import field_problems
from core.field_errors import fields_at, readable
from core.spec import JobSpec
from core.sweeps.spec import SweepSpec


def errors_of(model: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    return [dict(err) for err in e.value.errors()]


@pytest.mark.parametrize(
    ("misspelt", "meant"),
    [("epoch", "epochs"), ("batchsize", "batch_size"), ("ema-decay", "ema_decay")],
)
def test_a_misspelt_field_names_the_closest_one(misspelt: str, meant: str) -> None:
    (error,) = errors_of(JobSpec, {misspelt: 1})
    assert readable(error, JobSpec) == f"Extra inputs are not permitted; did you mean `{meant}`?"


def test_a_field_like_none_gets_no_guess() -> None:
    (error,) = errors_of(JobSpec, {"zzzzzz": 1})
    assert readable(error, JobSpec) == "Extra inputs are not permitted"


def test_a_misspelt_field_inside_a_sweep_is_named_from_its_own_model() -> None:
    body = {"base": {"epoch": 1}, "space": {"lr": {"choice": [0.1, 0.2]}}, "pruner": {"nme": "x"}}
    messages = {tuple(e["loc"]): readable(e, SweepSpec) for e in errors_of(SweepSpec, body)}
    assert messages[("base", "epoch")].endswith("did you mean `epochs`?")
    assert messages[("pruner", "nme")].endswith("did you mean `name`?")


def test_no_value_error_prefix() -> None:
    problems = field_problems(
        ValidationError.from_exception_data(
            "JobSpec",
            [{"type": "value_error", "loc": ("dataset",), "input": "x", "ctx": {"error": "no"}}],
        )
    )
    assert problems == ["dataset: no"]
    (error,) = errors_of(JobSpec, {"dataset": "ds:nope"})
    assert not readable(error, JobSpec).startswith("Value error")


def test_fields_at_walks_models_dicts_lists_and_optionals() -> None:
    assert "epochs" in fields_at(SweepSpec, ["base"])
    assert fields_at(SweepSpec, ["nothing", 3]) == []
    assert fields_at(None, []) == []

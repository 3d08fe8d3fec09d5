from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from core.spec import Amp, JobSpec


def field_of(exc: pytest.ExceptionInfo[ValidationError]) -> set[str]:
    return {".".join(str(p) for p in e["loc"]) for e in exc.value.errors()}


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"lr": -0.1}, "lr"),
        ({"lr": math.nan}, "lr"),
        ({"lr": math.inf}, "lr"),
        ({"weight_decay": -1}, "weight_decay"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 10**9}, "batch_size"),
        ({"epochs": 0}, "epochs"),
        ({"dataset": "imagenet"}, "dataset"),
        ({"dataset": "kmnist"}, "dataset"),  # offered no longer
        ({"amp": "fp8"}, "amp"),
        ({"optimizer": "lbfgs"}, "optimizer"),
        ({"grad_clip_norm": 0}, "grad_clip_norm"),
        ({"target_accuracy": 1.5}, "target_accuracy"),
        ({"learning_rate": 0.1}, "learning_rate"),  # unknown field
        ({"export": []}, "export"),
        ({"export": ["onnx", "pt2", "onnx"]}, "export"),
        ({"export": ["tflite"]}, "export.0"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(values)
    assert field in field_of(exc)


def test_nan_in_json_is_refused() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate_json('{"lr": NaN}')
    assert "lr" in field_of(exc)


def test_min_lr_above_lr_is_refused() -> None:
    with pytest.raises(ValidationError, match="min_lr"):
        JobSpec(lr=1e-4, min_lr=1e-3)


def test_defaults_round_trip_through_json() -> None:
    spec = JobSpec()
    again = JobSpec.model_validate(json.loads(spec.model_dump_json()))
    assert again == spec
    assert spec.amp is Amp.auto
    assert spec.channels_last is True

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import Field, ValidationError, create_model

from core.spec import SPEC_VERSION, Amp, JobSpec, spec_version


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


def test_a_stored_spec_without_the_recipe_fields_means_the_old_recipe() -> None:
    from core.spec import BEFORE_FIELD, stored_spec

    full = JobSpec(epochs=3).model_dump(mode="json")
    assert stored_spec(full) == JobSpec(epochs=3)  # a row of today: read as it is
    old = {k: v for k, v in full.items() if k not in BEFORE_FIELD}
    then = stored_spec(old)
    assert (then.augment, then.ema_decay, then.conv3_channels) == ("none", None, 0)
    assert then.epochs == 3
    # Each field that is there wins over the old meaning.
    assert stored_spec({**old, "conv3_channels": 64}).conv3_channels == 64


def test_the_spec_version_names_what_a_spec_may_hold_not_its_words() -> None:
    """Rewording a field's help keeps the version; a field more or less changes it."""
    fields = {k: (f.annotation, f) for k, f in JobSpec.model_fields.items()}
    reworded = {**fields, "lr": (float, Field(1e-3, gt=0, le=10, description="Another."))}
    same = create_model("JobSpec", __config__=JobSpec.model_config, **reworded)  # type: ignore[call-overload]
    fewer = {k: v for k, v in fields.items() if k != "priority"}
    older = create_model("JobSpec", __config__=JobSpec.model_config, **fewer)  # type: ignore[call-overload]
    assert len(SPEC_VERSION) == 12 and int(SPEC_VERSION, 16) >= 0
    assert spec_version(same) == SPEC_VERSION
    assert spec_version(older) != SPEC_VERSION

"""Whether one job's weights fit another spec's model (core.model_starts), by arithmetic,
against the load itself (core.train.archs.start_from) on the models as built: it refuses
what the load refuses and nothing else, whatever the classes."""

from __future__ import annotations

from typing import Any

import pytest

from core.model_starts import Shape, start_problem
from core.spec import JobSpec
from core.train.archs import build_model, start_from

JOB = "3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"
OWN = "ds:0f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"  # an uploaded set: its images any shape
CNN: dict[str, Any] = {"dataset": OWN}

CASES: list[tuple[dict[str, Any], Shape, dict[str, Any], Shape]] = [
    (CNN, (1, 28, 28), CNN, (1, 28, 28)),
    (CNN, (1, 28, 28), {**CNN, "conv1_channels": 16}, (1, 28, 28)),
    (CNN, (1, 28, 28), {**CNN, "conv2_channels": 32, "hidden": 64}, (1, 28, 28)),
    (CNN, (1, 28, 28), {**CNN, "conv3_channels": 0}, (1, 28, 28)),
    (CNN, (1, 28, 28), CNN, (3, 28, 28)),
    (CNN, (1, 28, 28), CNN, (1, 32, 32)),  # 3×3 maps before fc1, then 4×4
    (CNN, (1, 28, 28), CNN, (1, 29, 31)),  # other sides, the same maps
    (CNN, (3, 24, 36), CNN, (3, 36, 24)),  # 3×4 and 4×3 maps: as many features
    (CNN, (1, 4, 4), CNN, (1, 7, 7)),  # under 2 px after two pools: no third pool
    ({**CNN, "conv3_channels": 0}, (1, 28, 28), {**CNN, "conv3_channels": 0}, (1, 30, 30)),
    ({**CNN, "model": "resnet18"}, (3, 32, 32), {**CNN, "model": "resnet18"}, (3, 64, 64)),
    ({**CNN, "model": "resnet18"}, (3, 32, 32), {**CNN, "model": "resnet18"}, (3, 65, 65)),
    ({**CNN, "model": "resnet34"}, (3, 96, 96), {**CNN, "model": "resnet34"}, (3, 128, 80)),
    ({**CNN, "model": "resnet18"}, (3, 32, 32), {**CNN, "model": "resnet18"}, (1, 32, 32)),
    ({**CNN, "model": "mobilenet_v3_small"}, (3, 16, 16), {**CNN, "model": "mobilenet_v3_small"},
     (3, 96, 96)),
    ({**CNN, "model": "efficientnet_b0"}, (1, 16, 16), {**CNN, "model": "efficientnet_b0"},
     (3, 16, 16)),
    ({**CNN, "model": "efficientnet_lite0"}, (3, 9, 9), {**CNN, "model": "efficientnet_lite0"},
     (3, 96, 96)),
    (CNN, (3, 16, 16), {**CNN, "model": "mobilenet_v3_large"}, (3, 16, 16)),
]  # fmt: skip


def loads(source: JobSpec, source_shape: Shape, spec: JobSpec, shape: Shape) -> bool:
    weights = build_model(source, source_shape, 3).state_dict()
    try:
        start_from(build_model(spec, shape, 7), spec.model, weights)  # other classes, always
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(("source", "source_shape", "spec", "shape"), CASES)
def test_a_start_is_refused_exactly_where_the_weights_would_not_load(
    source: dict[str, Any], source_shape: Shape, spec: dict[str, Any], shape: Shape
) -> None:
    a, b = JobSpec(**source), JobSpec(**spec)
    problem = start_problem(JOB, a, source_shape, b, shape)
    assert (problem is None) == loads(a, source_shape, b, shape), problem


def test_the_refusal_names_the_field_and_what_would_fit() -> None:
    source = JobSpec()
    widths = start_problem(JOB, source, (1, 28, 28), JobSpec(conv1_channels=16, hidden=64), None)
    assert widths == (
        f"job {JOB} trained a cnn of conv1_channels 32, hidden 128, not conv1_channels 16, "
        "hidden 64: set conv1_channels 32, hidden 128"
    )
    spec = JobSpec(dataset=OWN)
    channels = start_problem(JOB, source, (1, 28, 28), spec, (3, 28, 28))
    assert channels is not None and "use a data set of 1-channel images" in channels
    size = start_problem(JOB, source, (1, 28, 28), spec, (1, 32, 32))
    assert size is not None and "fc1 takes 1,152 features" in size
    assert "use a data set of 1×28×28 images" in size
    model = start_problem(JOB, source, None, JobSpec(model="resnet18"), None)
    assert model == f"job {JOB} trained a cnn: set model 'cnn'"


def test_shapes_not_known_are_left_to_the_worker() -> None:
    spec = JobSpec(dataset=OWN)
    assert start_problem(JOB, JobSpec(), None, spec, (3, 32, 32)) is None
    assert start_problem(JOB, JobSpec(), (1, 28, 28), spec, None) is None

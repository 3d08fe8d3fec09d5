"""The CNN: the seed's two blocks, or three; any image size a data set may have."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from core.model_sizes import MAX_PARAMETERS, parameter_count
from core.spec import JobSpec
from core.train.model import Net


@pytest.mark.parametrize(
    ("size", "conv3", "fc1_inputs"),
    [
        ((28, 28), 0, 64 * 7 * 7),  # the seed's net
        ((28, 28), 128, 128 * 3 * 3),
        ((32, 20), 16, 16 * 4 * 2),
        ((4, 4), 128, 128 * 1 * 1),  # too small to pool a third time: kept at 1×1
        ((9, 6), 8, 8 * 2 * 1),  # 2×1 after two pools: no third pool
    ],
)
def test_every_image_size_gives_logits(size: tuple[int, int], conv3: int, fc1_inputs: int) -> None:
    net = Net(in_channels=3, image_size=size, conv3=conv3, num_classes=7).eval()
    assert net.fc1.in_features == fc1_inputs
    assert net(torch.rand(2, 3, *size)).shape == (2, 7)
    assert (net.block3 is None) == (conv3 == 0)


@pytest.mark.parametrize(
    ("shape", "widths"),
    [
        ((1, 28, 28), {}),
        ((1, 28, 28), {"conv3_channels": 0}),
        ((3, 32, 20), {"conv1_channels": 8, "conv3_channels": 16, "hidden": 40}),
        ((2, 4, 4), {"conv3_channels": 128}),
        ((1, 9, 6), {"conv3_channels": 8}),
    ],
)
def test_the_specs_parameter_count_is_the_nets(
    shape: tuple[int, int, int], widths: dict[str, int]
) -> None:
    """The API refuses a model by counting its parameters without building it: the count
    must be the net's own."""
    spec = JobSpec.model_validate(widths)
    net = Net(
        in_channels=shape[0],
        image_size=shape[1:],
        conv1=spec.conv1_channels,
        conv2=spec.conv2_channels,
        conv3=spec.conv3_channels,
        hidden=spec.hidden,
        num_classes=7,
    )
    assert parameter_count(spec, shape, 7) == sum(p.numel() for p in net.parameters())


def test_a_model_past_the_bound_is_refused_naming_its_size() -> None:
    with pytest.raises(ValidationError, match="parameters on 1×28×28 images"):
        JobSpec(conv1_channels=512, conv2_channels=1024, conv3_channels=2048, hidden=8192)
    assert parameter_count(JobSpec(), (1, 28, 28), 10) < MAX_PARAMETERS / 50

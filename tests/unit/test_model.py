"""The CNN: the seed's two blocks, or three; any image size a data set may have."""

from __future__ import annotations

import pytest
import torch

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

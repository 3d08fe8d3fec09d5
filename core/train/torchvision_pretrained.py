"""torchvision's architectures started from their ImageNet weights: the file torchvision
keeps in TORCH_HOME, verified and loaded without running anything (nothing is downloaded:
core.torchvision_weights), into a net built for the set (its stem's channels, its class
layer) (the mean and std they take: core.train.normalization). docs/models.md."""

from __future__ import annotations

import io
import pickle
import zipfile

import torch
from torch import nn

from core.spec import Architecture
from core.torchvision_weights import invalid, verified_bytes, weights_path

# What torchvision's ImageNet weights were trained on (core.train.normalization uses them):
# every Weights enum of these models has transforms ImageClassification(mean=..., std=...).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def imagenet_state(arch: Architecture) -> dict[str, torch.Tensor]:
    """The ImageNet state dict of `arch`, from the verified bytes of its file, loaded with
    `weights_only=True`: the bytes hashed are the bytes loaded, and nothing in them runs."""
    path, data = verified_bytes(arch)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError) as e:
        raise invalid(arch, f"{path} cannot be loaded as weights ({e})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise invalid(arch, f"{path} holds no state dict")
    return dict(state)


def load_imagenet_weights(net: nn.Module, arch: Architecture, stem: str, class_layer: str) -> None:
    """Load `arch`'s ImageNet weights into `net`, torchvision's `arch` built for the set:
    all but the class layer, which stays new (sized to the set's classes); on one channel
    the stem conv (`stem`) takes the sum of the RGB kernels, so a gray image is seen as the
    RGB net sees it with its channels equal. PretrainedWeightsInvalid, naming the file, for
    a file that is not `arch`'s."""
    state = imagenet_state(arch)
    own = net.state_dict()
    fresh = {k for k in own if k.startswith(class_layer + ".")}
    weights = {k: v for k, v in state.items() if k not in fresh}
    key = stem + ".weight"
    if key in weights and weights[key].dim() == 4 and own[key].shape[1] == 1:
        weights[key] = weights[key].sum(dim=1, keepdim=True)
    missing = sorted(set(own) - fresh - set(weights))
    unexpected = sorted(set(weights) - set(own))
    wrong = sorted(k for k in own if k in weights and weights[k].shape != own[k].shape)
    if missing or unexpected or wrong:
        first = (missing + unexpected + wrong)[0]
        raise invalid(
            arch,
            f"{weights_path(arch)} is not a "
            f"{arch.value}'s state dict ({len(missing)} missing, {len(unexpected)} unexpected, "
            f"{len(wrong)} of another shape; first: {first!r})",
        )
    net.load_state_dict(weights, strict=False)

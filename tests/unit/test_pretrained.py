"""EfficientNet-Lite0's ImageNet weights: the pinned file and nothing else, the architecture
that fits them exactly, and top-5 on real photos naming what is in them (docs/models.md)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from efficientnet_lite_pytorch import EfficientNet
from skimage import data
from torchvision.models import EfficientNet_B0_Weights
from torchvision.transforms import v2

from core.errors import PretrainedWeightsInvalid
from core.train import pretrained
from core.train.pretrained import (
    backbone_parameters,
    efficientnet_lite0,
    head_parameters,
    imagenet_efficientnet_lite0,
    load_weights,
    packaged_weights,
)

CATEGORIES = EfficientNet_B0_Weights.IMAGENET1K_V1.meta["categories"]

# scikit-image's photos and the ImageNet classes that name what is in them. ImageNet has no
# person class: the astronaut's photo holds a helmet, a space-shuttle model and a flag.
PHOTOS = {
    "chelsea": {"tabby", "tiger cat", "Egyptian cat"},
    "coffee": {"espresso", "cup", "coffee mug"},
    "rocket": {"missile", "projectile", "space shuttle"},
    "astronaut": {"crash helmet", "football helmet", "space shuttle", "flagpole"},
}

PREPROCESS = v2.Compose(
    [
        v2.ToImage(),
        v2.Resize(pretrained.RESIZE_TO, interpolation=v2.InterpolationMode.BICUBIC),
        v2.CenterCrop(pretrained.IMAGE_SIZE),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(pretrained.MEAN, pretrained.STD),
    ]
)


@pytest.fixture(scope="module")
def imagenet_model() -> torch.nn.Module:
    return imagenet_efficientnet_lite0().eval()


def top5(model: torch.nn.Module, photo: np.ndarray) -> list[str]:
    with torch.no_grad():
        logits = model(PREPROCESS(photo)[None])
    return [CATEGORIES[i] for i in logits[0].topk(5).indices.tolist()]


@pytest.mark.parametrize("name", sorted(PHOTOS))
def test_top5_names_what_is_in_each_photo(imagenet_model: torch.nn.Module, name: str) -> None:
    labels = top5(imagenet_model, getattr(data, name)())
    assert PHOTOS[name] & set(labels), f"{name}: top-5 was {labels}"


def test_the_cat_is_a_cat_and_the_coffee_an_espresso(imagenet_model: torch.nn.Module) -> None:
    """The two unambiguous photos, more strictly: their class first."""
    assert top5(imagenet_model, data.chelsea())[0] in PHOTOS["chelsea"]
    assert top5(imagenet_model, data.coffee())[0] == "espresso"


def test_the_net_gives_the_reference_implementations_logits() -> None:
    """The package's own model code (EfficientNet-PyTorch's Lite port): the same weights
    give the same logits, so every layer, padding and epsilon is the one they were
    trained with."""
    reference = EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=str(packaged_weights())
    ).eval()
    x = torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(imagenet_efficientnet_lite0().eval()(x), reference(x))


def test_a_replaced_weights_file_is_refused(tmp_path: Path) -> None:
    """Any other bytes fail loudly, a file torch would load as happily included."""
    damaged = tmp_path / pretrained.WEIGHTS_FILE
    shutil.copyfile(packaged_weights(), damaged)
    with damaged.open("r+b") as f:
        f.seek(-100, 2)
        f.write(b"\x00" * 8)
    with pytest.raises(PretrainedWeightsInvalid, match="not the pinned"):
        load_weights(damaged)
    other = tmp_path / "other.pth"
    torch.save(imagenet_efficientnet_lite0().state_dict(), other)
    with pytest.raises(PretrainedWeightsInvalid, match="was replaced or damaged"):
        efficientnet_lite0(10, 3, pretrained=True, weights=other)


def test_a_missing_weights_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(PretrainedWeightsInvalid, match="cannot read"):
        load_weights(tmp_path / "absent.pth")


def test_a_new_head_on_the_pretrained_backbone() -> None:
    imagenet = imagenet_efficientnet_lite0()
    model = efficientnet_lite0(7, 3, pretrained=True)
    assert model.classifier.out_features == 7
    for (name, mine), theirs in zip(
        model.state_dict().items(), imagenet.state_dict().values(), strict=True
    ):
        if not name.startswith("classifier."):
            assert torch.equal(mine, theirs), name
    scratch = efficientnet_lite0(7, 3, pretrained=False)
    assert not torch.equal(scratch.stem[0].weight, model.stem[0].weight)


def test_a_gray_image_on_the_one_channel_stem_is_the_rgb_one_with_equal_channels() -> None:
    """Summing the RGB kernels: the one-channel net sees a gray image as the RGB net sees
    it with its three channels equal."""
    gray = efficientnet_lite0(4, 1, pretrained=True).eval()
    rgb = imagenet_efficientnet_lite0().eval()
    x = torch.rand(2, 1, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        features = rgb.head(rgb.blocks(rgb.stem(x.expand(-1, 3, -1, -1))))
        torch.testing.assert_close(gray.head(gray.blocks(gray.stem(x))), features)
    assert gray(x).shape == (2, 4)


def test_backbone_and_head_parameters_split_the_model() -> None:
    model = efficientnet_lite0(5, 3, pretrained=True)
    backbone = {id(p) for p in backbone_parameters(model)}
    head = {id(p) for p in head_parameters(model)}
    assert not backbone & head
    assert backbone | head == {id(p) for p in model.parameters()}
    assert head == {id(model.classifier.weight), id(model.classifier.bias)}


def test_a_frozen_backbone_moves_only_the_head() -> None:
    model = efficientnet_lite0(3, 3, pretrained=True)
    for p in backbone_parameters(model):
        p.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(head_parameters(model), lr=0.1)
    model.eval()  # BN statistics stay as they are
    x = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2, 0])).backward()
    optimizer.step()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]) != name.startswith("classifier."), name


@pytest.mark.slow
def test_exported_it_gives_the_same_logits() -> None:
    """torch.export (what the pt2 and ONNX formats start from), with a dynamic batch, and
    TorchScript's trace: the padding is no Python the export would freeze wrongly."""
    model = efficientnet_lite0(6, 3, pretrained=True).eval()
    x = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(model, (x[:2],), dynamic_shapes=({0: batch},)).module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # TorchScript is deprecated
        traced = torch.jit.trace(model, x)
    with torch.no_grad():
        torch.testing.assert_close(exported(x), model(x))
        torch.testing.assert_close(traced(x), model(x))


@pytest.mark.parametrize(
    ("kernel", "stride", "size"), [(1, 1, 12), (3, 1, 12), (5, 1, 11), (3, 2, 12)]
)
def test_same_padding_pads_a_copy_only_where_it_is_lopsided(
    monkeypatch: pytest.MonkeyPatch, kernel: int, stride: int, size: int
) -> None:
    """SAME's padding, symmetric at stride 1, is the conv's own: no padded copy of the
    activation (which F.pad makes even of a zero padding). Lopsided (stride 2, an even
    side), it pads a copy as TensorFlow did. The same figures either way."""
    torch.manual_seed(0)
    conv = pretrained.SameConv2d(4, 6, kernel, stride, groups=1).eval()
    x = torch.randn(2, 4, size, size)
    pretrained.fit_padding(conv, (4, size, size))
    want = torch.nn.functional.conv2d(
        torch.nn.functional.pad(x, conv.same), conv.weight, None, stride
    )
    pads = []
    real_pad = torch.nn.functional.pad
    monkeypatch.setattr(
        pretrained.F, "pad", lambda t, p, *a, **k: pads.append(p) or real_pad(t, p, *a, **k)
    )
    with torch.no_grad():
        got = conv(x)
    torch.testing.assert_close(got, want)
    left, right, top, bottom = conv.same
    assert bool(pads) == (left != right or top != bottom)

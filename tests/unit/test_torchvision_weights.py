"""torchvision's ImageNet weights (core.torchvision_weights, core.train.torchvision_pretrained):
taken only from the file torchvision itself keeps in TORCH_HOME, verified by the sha256
prefix in its name, never downloaded; a missing, replaced or unloadable file is a named
error that says how to install it; a verified file lands in the model with a new classifier
and a stem fitted to the set (docs/models.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path

import pytest
import torch
import torch.hub
from pydantic import ValidationError
from torchvision import models as tv

from core import torchvision_weights
from core.errors import PretrainedWeightsInvalid
from core.model_sizes import parameter_count
from core.spec import Architecture, JobSpec
from core.torchvision_weights import TORCHVISION_WEIGHTS, check_weights_file, weights_path
from core.train import train
from core.train.archs import PARTS, build_model
from core.train.normalization import PRETRAINED, of_pretrained
from core.train.pretrained import MEAN as LITE0_MEAN
from core.train.torchvision_pretrained import IMAGENET_MEAN, IMAGENET_STD
from tests.photos import write_photo_set


@pytest.fixture
def torch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty TORCH_HOME: nothing of the machine's own cache is seen."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    return tmp_path / "torch"


def install(arch: Architecture, state: dict[str, torch.Tensor], name: str | None = None) -> Path:
    """`state` saved where torchvision keeps `arch`'s weights: under the expected name, or
    under `name` (then the table is pointed at it by the caller)."""
    path = weights_path(arch) if name is None else weights_path(arch).with_name(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


def pin_own_file(monkeypatch: pytest.MonkeyPatch, arch: Architecture) -> dict[str, torch.Tensor]:
    """A randomly initialised ImageNet-shaped `arch` saved under a name that carries its own
    sha256 prefix, and the table pointed at that name: a file that verifies."""
    state = getattr(tv, arch.value)(weights=None).state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    name = f"{arch.value}-{hashlib.sha256(buffer.getvalue()).hexdigest()[:8]}.pth"
    entry = TORCHVISION_WEIGHTS[arch]
    url = entry.url.rsplit("/", 1)[0] + "/" + name
    monkeypatch.setitem(TORCHVISION_WEIGHTS, arch, dataclasses.replace(entry, url=url))
    path = weights_path(arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return state


def pretrained(arch: str) -> JobSpec:
    return JobSpec(model=arch, pretrained=True)


@pytest.mark.parametrize("arch", list(TORCHVISION_WEIGHTS))
def test_each_file_is_the_one_torchvision_downloads_by_default(arch: Architecture) -> None:
    entry = TORCHVISION_WEIGHTS[arch]
    default = tv.get_model_weights(arch.value).DEFAULT
    assert entry.weights == str(default) and entry.url == default.url
    assert entry.url.endswith(f"/{entry.file_name}")
    assert torch.hub.HASH_REGEX.search(entry.file_name)[1] == entry.sha256_prefix  # type: ignore[index]


def test_the_folder_is_torch_hubs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert torchvision_weights.hub_dir() == Path(torch.hub.get_dir())
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "home"))
    assert torchvision_weights.hub_dir() == Path(torch.hub.get_dir()) == tmp_path / "home/hub"
    assert weights_path(Architecture.resnet18) == (
        tmp_path / "home/hub/checkpoints/resnet18-f37072fd.pth"
    )


def test_pretrained_is_offered_for_torchvisions_models_but_not_the_cnn() -> None:
    for arch in TORCHVISION_WEIGHTS:
        assert pretrained(arch).pretrained
    with pytest.raises(ValidationError, match="not cnn"):
        pretrained("cnn")


def test_a_missing_file_is_refused_saying_where_it_goes_and_how_to_get_it(
    torch_home: Path,
) -> None:
    expected = torch_home / "hub/checkpoints/resnet18-f37072fd.pth"
    with pytest.raises(PretrainedWeightsInvalid) as e:
        build_model(pretrained("resnet18"), (3, 32, 32), 10)
    message = e.value.message
    assert str(expected) in message and "not there" in message
    assert "torchvision.models.resnet18(weights='IMAGENET1K_V1')" in message
    assert "hub/checkpoints" in message
    with pytest.raises(PretrainedWeightsInvalid, match="not there"):
        check_weights_file(Architecture.resnet18)


def test_randomly_initialised_weights_under_the_expected_name_are_refused(
    torch_home: Path,
) -> None:
    """A torchvision resnet18 as built, not as trained: its bytes do not hash to the prefix
    in the name, so it is never loaded, in the worker or at submission."""
    path = install(Architecture.resnet18, tv.resnet18(weights=None).state_dict())
    for check in (
        lambda: build_model(pretrained("resnet18"), (3, 32, 32), 10),
        lambda: check_weights_file(Architecture.resnet18),
    ):
        with pytest.raises(PretrainedWeightsInvalid) as e:
            check()
        assert str(path) in e.value.message and "does not start with f37072fd" in e.value.message
        assert "torchvision.models.resnet18(weights='IMAGENET1K_V1')" in e.value.message


@pytest.mark.parametrize("shape", [(1, 32, 32), (3, 96, 96)])  # gray and small; standard
def test_a_verified_resnet18_lands_in_the_model_with_a_new_classifier(
    torch_home: Path, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int]
) -> None:
    state = pin_own_file(monkeypatch, Architecture.resnet18)
    net = build_model(pretrained("resnet18"), shape, 5)
    own = net.state_dict()
    stem = state["conv1.weight"]  # (64, 3, 7, 7)
    assert torch.equal(own["conv1.weight"], stem if shape[0] == 3 else stem.sum(1, keepdim=True))
    body = [k for k in own if not k.startswith(("conv1.", "fc."))]
    assert len(body) > 100 and all(torch.equal(own[k], state[k]) for k in body)
    assert own["fc.weight"].shape == (5, 512)  # new, sized to the classes
    small = shape[1] <= 64
    assert net.conv1.stride == ((1, 1) if small else (2, 2))  # the pretrained 7×7 kernels
    assert isinstance(net.maxpool, torch.nn.Identity) == small
    spec = pretrained("resnet18")
    assert parameter_count(spec, shape, 5) == sum(p.numel() for p in net.parameters())
    with torch.inference_mode():
        assert net.eval()(torch.rand(2, *shape)).shape == (2, 5)


@pytest.mark.parametrize("arch", ["mobilenet_v3_small", "efficientnet_b0"])
def test_a_verified_file_lands_in_a_mobilenet_or_efficientnet(
    torch_home: Path, monkeypatch: pytest.MonkeyPatch, arch: str
) -> None:
    state = pin_own_file(monkeypatch, Architecture(arch))
    net = build_model(pretrained(arch), (1, 16, 16), 3)
    own = net.state_dict()
    stem = state["features.0.0.weight"]
    assert torch.equal(own["features.0.0.weight"], stem.sum(1, keepdim=True))
    assert net.features[0][0].stride == (1, 1)
    layer = PARTS[Architecture(arch)].class_layer  # new, sized to the classes
    changed = [k for k in own if own[k].shape != state[k].shape]
    assert changed == ["features.0.0.weight", f"{layer}.weight", f"{layer}.bias"]
    assert all(torch.equal(own[k], state[k]) for k in own if k not in changed)


def test_a_file_that_verifies_but_is_not_the_architectures_is_refused(
    torch_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its name's prefix matches its bytes, but it is not a state dict of a resnet18."""
    for data in (b"not a checkpoint", None):
        entry = TORCHVISION_WEIGHTS[Architecture.resnet18]
        if data is None:
            buffer = io.BytesIO()
            torch.save(tv.mobilenet_v3_small(weights=None).state_dict(), buffer)
            data = buffer.getvalue()
        name = f"resnet18-{hashlib.sha256(data).hexdigest()[:8]}.pth"
        url = entry.url.rsplit("/", 1)[0] + "/" + name
        monkeypatch.setitem(TORCHVISION_WEIGHTS, entry.arch, dataclasses.replace(entry, url=url))
        weights_path(entry.arch).parent.mkdir(parents=True, exist_ok=True)
        weights_path(entry.arch).write_bytes(data)
        with pytest.raises(PretrainedWeightsInvalid, match=name) as e:
            build_model(pretrained("resnet18"), (3, 32, 32), 10)
        assert "IMAGENET1K_V1" in e.value.message


def test_the_submission_check_sees_a_file_replaced_since(
    torch_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verified once per (path, size, modification time): a file replaced afterwards is
    hashed again, and refused."""
    pin_own_file(monkeypatch, Architecture.resnet18)
    check_weights_file(Architecture.resnet18)
    check_weights_file(Architecture.resnet18)  # from the cache
    path = weights_path(Architecture.resnet18)
    path.write_bytes(path.read_bytes()[:-1])  # another size: a coarse clock may keep the time
    with pytest.raises(PretrainedWeightsInvalid, match="does not start with"):
        check_weights_file(Architecture.resnet18)


def test_pretrained_jobs_are_normalised_as_their_weights_were_trained() -> None:
    resnet = of_pretrained(Architecture.resnet18, 3)
    assert (resnet.mean, resnet.std, resnet.by) == (IMAGENET_MEAN, IMAGENET_STD, PRETRAINED)
    assert IMAGENET_MEAN == (0.485, 0.456, 0.406) and IMAGENET_STD == (0.229, 0.224, 0.225)
    for arch in TORCHVISION_WEIGHTS:
        assert of_pretrained(arch, 3).mean == IMAGENET_MEAN
    gray = of_pretrained(Architecture.efficientnet_b0, 1)
    assert len(gray.mean) == len(gray.std) == 1
    assert (gray.mean[0], gray.std[0]) == pytest.approx((0.449, 0.226), abs=1e-3)
    lite = of_pretrained(Architecture.efficientnet_lite0, 1)
    assert lite.mean == pytest.approx(LITE0_MEAN[:1])


@pytest.mark.slow
def test_a_pretrained_job_trains_and_its_record_names_the_file(
    torch_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pin_own_file(monkeypatch, Architecture.mobilenet_v3_small)
    spec = JobSpec(
        dataset=write_photo_set(tmp_path, side=16, per_class=4), model="mobilenet_v3_small",
        pretrained=True, epochs=1, batch_size=8, max_steps=2, export=["torchscript"],
    )  # fmt: skip
    weights = train(spec, data_dir=tmp_path).record["pretrained_weights"]
    entry = TORCHVISION_WEIGHTS[Architecture.mobilenet_v3_small]
    assert weights == {
        "torchvision": "MobileNet_V3_Small_Weights.IMAGENET1K_V1", "file": entry.file_name,
        "url": entry.url, "sha256_prefix": entry.sha256_prefix,
    }  # fmt: skip

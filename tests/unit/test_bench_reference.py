"""bench.vs_reference compares like with like: the reference script, looking a model up by
name, builds trainq's own network, and the folders it reads are the set trainq's upload
makes, split and named alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torchvision
from torchvision.datasets import ImageFolder

from api.photo_sets import PhotoOptions
from api.uploads import parse_upload
from bench.reference_shim import register_models
from bench.vs_reference import write_folders, zipped
from core.data_sources import SOURCES, file_problems
from core.spec import Architecture, JobSpec
from core.train.archs import build_model
from tests.service import DATASETS_CACHE


@pytest.fixture
def registered() -> Iterator[None]:
    register_models(32)
    yield
    for arch in Architecture:
        delattr(torchvision.models, f"trainq_{arch.value}")
        torchvision.models._api.BUILTIN_MODELS.pop(f"trainq_{arch.value}", None)


@pytest.mark.parametrize("arch", ["cnn", "resnet18"])
def test_the_reference_builds_trainqs_own_network(registered: None, arch: str) -> None:
    ours = build_model(JobSpec(model=arch), (3, 32, 32), 10).state_dict()
    # train.py before torchvision 0.13 looks in the module; later ones call get_model.
    by_dict = torchvision.models.__dict__[f"trainq_{arch}"](pretrained=False, num_classes=10)
    by_registry = torchvision.models.get_model(f"trainq_{arch}", weights=None, num_classes=10)
    for net in (by_dict, by_registry):
        theirs = net.state_dict()
        assert list(theirs) == list(ours)
        assert all(theirs[k].shape == ours[k].shape for k in ours)


@pytest.mark.skipif(
    bool(file_problems(SOURCES["fashion-mnist"], DATASETS_CACHE)),
    reason="no verified Fashion-MNIST in the datasets cache (`trainq data install`)",
)
def test_the_folders_are_the_set_trainqs_upload_makes(tmp_path: Path) -> None:
    made = write_folders(tmp_path, 40)
    parsed = parse_upload(zipped(tmp_path), options=PhotoOptions(image_size=32))
    reference = ImageFolder(str(tmp_path / "train"))
    assert (parsed.train_count, parsed.test_count) == (40, 10) == (made["train_images"], 10)
    assert parsed.image_shape == (3, 32, 32)
    assert parsed.classes == tuple(reference.classes)
    assert "T-shirt-top" in reference.classes and len(reference) == 40

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchvision import datasets

from core.errors import DatasetNotFound
from core.spec import JobSpec
from core.train import train
from core.train.data import IDX_FILES, ResidentBatches, load_dataset, steps_per_epoch


def test_mnist_sample_is_read_by_torchvision_mnist(data_dir: Path) -> None:
    root = data_dir / "mnist-sample"
    train_set = datasets.MNIST(str(root), train=True)
    test_set = datasets.MNIST(str(root), train=False)
    assert (len(train_set), len(test_set)) == (4000, 1000)
    assert train_set.data.dtype == torch.uint8 and train_set.data.shape[1:] == (28, 28)
    # Stratified: every digit in both splits, in the same 4:1 proportion.
    train_counts = torch.bincount(train_set.targets, minlength=10)
    test_counts = torch.bincount(test_set.targets, minlength=10)
    assert (test_counts > 0).all()
    assert torch.allclose(
        train_counts.float() / test_counts.float(), torch.full((10,), 4.0), atol=0.1
    )
    # Real digits: ink on a black background, not noise.
    assert 0.10 < train_set.data.float().div(255).mean() < 0.16


# The 4,000 / 1,000 digits every data folder holds (pixels and labels, train then test): a
# new split would make runs on different hosts, or before and after an upgrade, disagree.
MNIST_SAMPLE_SHA256 = "e7444f1f91917b589c826ab04f9e5c236731ba78d53e7b04dc881d68d41608fb"


def test_dataset_is_loaded_with_stats_and_a_stable_checksum(data_dir: Path) -> None:
    a = load_dataset("mnist-sample", data_dir)
    b = load_dataset("mnist-sample", data_dir)
    assert a.sha256 == b.sha256 == MNIST_SAMPLE_SHA256
    assert a.image_shape == (1, 28, 28)
    assert a.num_classes == 10
    assert len(a.std) == 1 and 0.25 < a.std[0] < 0.40  # one channel: a 1-tuple


def test_a_missing_data_folder_names_the_folder_and_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFound) as exc:
        train(JobSpec(dataset="fashion-mnist"), data_dir=tmp_path / "nowhere")
    message = str(exc.value)
    assert str(tmp_path / "nowhere" / "FashionMNIST" / "raw") in message
    for name in IDX_FILES:
        assert name in message


def test_resident_batches_cover_every_image_once_per_epoch(data_dir: Path) -> None:
    data = load_dataset("mnist-sample", data_dir)
    batches = ResidentBatches(
        data.train,
        torch.device("cpu"),
        batch_size=128,
        mean=data.mean,
        std=data.std,
        channels_last=True,
        seed=3,
    )
    seen = torch.cat([y for _, y in batches.epoch(1)])
    assert len(seen) == 4000 == len(batches) * 128 - (128 - 4000 % 128)
    assert torch.equal(torch.bincount(seen, minlength=10), torch.bincount(data.train.labels))
    first = next(batches.epoch(1))[1]
    assert torch.equal(first, next(batches.epoch(1))[1])  # order is a function of (seed, epoch)
    assert not torch.equal(first, next(batches.epoch(2))[1])
    x, _ = next(batches.epoch(1))
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert abs(float(x.mean())) < 0.2  # normalised on the device


def test_a_last_batch_of_one_is_dropped() -> None:
    assert steps_per_epoch(257, 128) == 2
    assert steps_per_epoch(258, 128) == 3

"""The article's input pipeline, kept so that trainq's own (core.train.data.ResidentBatches)
can be compared with it: a classic DataLoader over torchvision's transforms."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset
from torchvision import datasets, transforms

from core.spec import user_dataset_id
from core.train.augment import Augmenter
from core.train.data import Dataset, Split, augment_generator, epoch_seed, torchvision_set


def loader_batches(
    dataset: Dataset,
    device: torch.device,
    *,
    batch_size: int,
    channels_last: bool,
    seed: int,
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool,
    prefetch_factor: int,
    augment: Augmenter | None = None,
) -> LoaderBatches:
    """The article's input pipeline: ToTensor + Normalize per PIL image in DataLoader workers
    (per uint8 tensor for an uploaded data set, which has no torchvision loader)."""
    ds: _NormalizedImages | datasets.MNIST
    norm = dataset.normalization
    if user_dataset_id(dataset.name) is not None:
        ds = _NormalizedImages(dataset.train, norm.mean, norm.std)
    else:
        tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(norm.mean, norm.std)])
        ds = torchvision_set(dataset.name, dataset.root, train=True, download=False, transform=tf)
    g = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        generator=g,
        num_workers=num_workers,
        pin_memory=pin_memory and device.type == "cuda",
        persistent_workers=persistent_workers and num_workers > 0,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        drop_last=len(ds) % batch_size == 1,
    )
    return LoaderBatches(loader, g, device, channels_last, seed, augment)


class _NormalizedImages(TorchDataset[tuple[torch.Tensor, torch.Tensor]]):
    """One normalised float image and its label per item (picklable for worker processes)."""

    def __init__(self, split: Split, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.split = split
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.split.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.split.images[i].float().div_(255).sub_(self.mean).div_(self.std)
        return x, self.split.labels[i]


class LoaderBatches:
    def __init__(
        self,
        loader: DataLoader,
        generator: torch.Generator,
        device: torch.device,
        channels_last: bool,
        seed: int,
        augment: Augmenter | None = None,
    ) -> None:
        self.loader = loader
        self.generator = generator
        self.device = device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.seed = seed
        self.augment = augment

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.generator.manual_seed(epoch_seed(self.seed, epoch))
        moves = augment_generator(self.device, self.seed, epoch)
        for x, y in self.loader:
            x = x.to(self.device, non_blocking=True)
            if self.augment is not None:
                x = self.augment(x, moves)
            yield (
                x.contiguous(memory_format=self.memory_format),
                y.to(self.device, non_blocking=True),
            )

"""trainq's trainer against the seed article's pipeline, in one process, on the same data.

The data: the full MNIST (60,000 training images, 10,000 test) as `trainq data install mnist`
places it, read by torchvision's MNIST loader in both pipelines.

The baseline is the article as written: ToTensor + Normalize per PIL image in a DataLoader
(num_workers=4, pin_memory, persistent_workers, prefetch_factor=2), the CNN with `view`,
`.item()` twice a step, AdamW + per-epoch cosine; fp32 on the CPU (the article's fp16
GradScaler path on CUDA). trainq runs its default spec.

Prints one JSON object: images/s and test accuracy of each, and their ratio.
    python -m bench.trainer [--epochs 1] [--ablate]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision import datasets, transforms

from core.config import Settings
from core.data_sources import SOURCES, file_problems
from core.spec import JobSpec
from core.train import Callbacks, train
from core.train.device import device_name, resolve_device
from tests.service import DATASETS_CACHE


def bench_data_dir() -> Path:
    """The data folder holding the verified full MNIST: TRAINQ_DATA_DIR's, else the cache
    scripts/setup installs into."""
    candidates = [Settings().data_dir, DATASETS_CACHE]
    for root in candidates:
        if not file_problems(SOURCES["mnist"], root):
            return root
    raise SystemExit(
        f"bench: no verified MNIST in {' or '.join(map(str, candidates))}: run "
        f"`trainq data install mnist --data-dir {DATASETS_CACHE}` (scripts/setup does)"
    )


class ArticleNet(nn.Module):
    """The article's CNN as written: conv bias, ReLU before pool, `view` to flatten."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(F.relu(self.bn1(self.conv1(x))))
        x = self.pool2(F.relu(self.bn2(self.conv2(x))))
        x = x.view(x.size(0), -1)
        return self.fc2(F.relu(self.fc1(x)))


def run_article(
    root: Path, epochs: int, device: torch.device, *, dataset: str = "mnist"
) -> dict[str, Any]:
    """The article's loop as written, validating after every epoch as its main loop does.
    `epochs_seen` holds (seconds since the start, test accuracy) per epoch."""
    started = time.perf_counter()
    torch.manual_seed(0)
    mean, std = ARTICLE_NORMALIZE[dataset]
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])
    cls = datasets.FashionMNIST if dataset == "fashion-mnist" else datasets.MNIST
    train_set = cls(str(root), train=True, transform=transform)
    test_set = cls(str(root), train=False, transform=transform)
    train_loader = torch.utils.data.DataLoader(
        train_set,
        batch_size=128,
        shuffle=True,
        num_workers=4,
        pin_memory=True,
        persistent_workers=True,
        prefetch_factor=2,
    )
    test_loader = torch.utils.data.DataLoader(
        test_set, batch_size=1000, shuffle=False, num_workers=2, pin_memory=True
    )
    model = ArticleNet().to(device)
    use_amp = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10, eta_min=1e-5)
    images, seconds = 0, 0.0
    seen: list[tuple[float, float]] = []
    for _ in range(epochs):
        model.train()
        t0 = time.perf_counter()
        running_loss, correct = 0.0, 0
        for data, target in train_loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=torch.float16, enabled=use_amp):
                output = model(data)
                loss = criterion(output, target)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            running_loss += loss.item()
            correct += output.argmax(1).eq(target).sum().item()
            images += len(target)
        seconds += time.perf_counter() - t0
        scheduler.step()
        model.eval()
        right = 0
        with torch.no_grad():
            for data, target in test_loader:
                right += model(data.to(device)).argmax(1).eq(target.to(device)).sum().item()
        seen.append((time.perf_counter() - started, right / len(test_set)))
    return {
        "images_per_second": images / seconds,
        "train_seconds": seconds,
        "test_accuracy": seen[-1][1],
        "epochs_seen": seen,
    }


ARTICLE_NORMALIZE = {"mnist": ((0.1307,), (0.3081,)), "fashion-mnist": ((0.2860,), (0.3530,))}


def seconds_to(accuracy: float, seen: list[tuple[float, float]]) -> float | None:
    """Seconds from the start to the end of the first epoch at `accuracy` or better."""
    return next((t for t, acc in seen if acc >= accuracy), None)


def run_trainq(
    root: Path, epochs: int | None, device: torch.device, **overrides: Any
) -> dict[str, Any]:
    """A spec (the default, with `overrides`) through trainq's trainer; `epochs_seen` as for
    run_article, from the start of `train` (data loading and model build included)."""
    spec = JobSpec.model_validate(
        {"dataset": "mnist", **({} if epochs is None else {"epochs": epochs}), **overrides}
    )
    started = time.perf_counter()
    seen: list[tuple[float, float]] = []
    cb = Callbacks(on_epoch=lambda m: seen.append((time.perf_counter() - started, m.test_accuracy)))
    result = train(spec, data_dir=root, device=str(device), callbacks=cb)
    return {
        "spec_overrides": overrides,
        "amp": result.record["amp_resolved"],
        "images_per_second": result.images_per_second,
        "train_seconds": sum(e.duration_s for e in result.epochs),
        "test_accuracy": result.test_accuracy,
        "epochs_seen": seen,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--ablate", action="store_true", help="also time trainq variants")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)  # pin_memory without a GPU
    device = resolve_device(args.device)
    root = bench_data_dir()
    article = run_article(root, args.epochs, device)
    ours = run_trainq(root, args.epochs, device)
    out: dict[str, Any] = {
        "benchmark": "trainer",
        "device": device_name(device),
        "train_images_per_epoch": 60_000,
        "epochs": args.epochs,
        "article": article,
        "trainq": ours,
        "speedup": ours["images_per_second"] / article["images_per_second"],
        "accuracy_delta": ours["test_accuracy"] - article["test_accuracy"],
    }
    if args.ablate:
        variants = {
            # The seed's own two-block net, no augmentation, no moving average: the same
            # network as the article's, through trainq's pipeline.
            "the_seeds_cnn": {"conv3_channels": 0, "augment": "none", "ema_decay": None},
            "at_the_articles_batch_size_128": {"batch_size": 128},
            "no_channels_last": {"channels_last": False},
            "dataloader_path": {"data_path": "dataloader", "num_workers": 1},
        }
        out["ablation"] = {
            name: run_trainq(root, args.epochs, device, **kw) for name, kw in variants.items()
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

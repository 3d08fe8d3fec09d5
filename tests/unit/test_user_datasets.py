"""Uploaded data sets as jobs name them: the spec's names, a missing set, and the trainer
reading the canonical .npz."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from api.uploads import parse_upload
from core.errors import DatasetNotFound
from core.spec import JobSpec
from core.train import train
from core.train.data import load_dataset
from core.train.verify_export import load_torchscript
from tests.uploads import npz_bytes, place


def test_spec_names_uploaded_sets() -> None:
    ds_id = uuid.uuid4()
    assert JobSpec(dataset=f"ds:{str(ds_id).upper()}").dataset == f"ds:{ds_id}"
    assert JobSpec().dataset == "mnist-sample"
    for bad in ["ds:", "ds:not-a-uuid", "imagenet", f"DS:{ds_id}"]:
        with pytest.raises(ValidationError, match="unknown data set"):
            JobSpec(dataset=bad)


def test_a_missing_uploaded_set_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFound, match="is missing"):
        load_dataset(f"ds:{uuid.uuid4()}", tmp_path)


@pytest.mark.slow  # over 10 s: the full run, not --fast
@pytest.mark.parametrize("data_path", ["device", "dataloader"])
def test_trainer_on_an_rgb_non_square_set(data_path: str, tmp_path: Path) -> None:
    """Net, the export check and the record follow the data: 3×20×12, 5 classes."""
    rng = np.random.default_rng(0)
    y_train, y_test = np.arange(100) % 5, np.arange(20) % 5
    parsed = parse_upload(npz_bytes(
        x_train=rng.integers(0, 256, (100, 20, 12, 3), dtype=np.uint8), y_train=y_train,
        x_test=rng.integers(0, 256, (20, 20, 12, 3), dtype=np.uint8), y_test=y_test,
    ))  # fmt: skip
    name = place(parsed, tmp_path)
    spec = JobSpec(dataset=name, epochs=1, batch_size=32, data_path=data_path, num_workers=0)
    result = train(spec, data_dir=tmp_path)
    assert result.record["dataset"]["image_shape"] == [3, 20, 12]
    assert result.record["dataset"]["name"] == name
    model = load_torchscript(result.models["torchscript"].data)
    logits = model(torch.rand(4, 3, 20, 12))
    assert logits.shape == (4, 5)

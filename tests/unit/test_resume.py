"""Runs that end in any case: a resume from the checkpoint that ended the run exports and
reports it; a data set with nothing to normalise trains."""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from core.spec import JobSpec
from core.train import TrainResult, train
from core.train.data import load_dataset, user_dataset_path
from core.train.run import Run, read_saved
from core.train.verify_export import load_torchscript
from tests.conftest import Recorder

REPORTED = ("test_accuracy", "test_loss", "train_loss", "epochs", "steps", "stopped_early")


def logits(result: TrainResult, images: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return load_torchscript(result.models["torchscript"].data)(images)


@pytest.mark.slow  # two training runs
def test_a_resume_from_the_final_checkpoint_exports_and_reports_the_run(data_dir: Path) -> None:
    spec = JobSpec(epochs=2, batch_size=512, seed=3)
    rec = Recorder()
    first = train(spec, data_dir=data_dir, callbacks=rec.callbacks())
    final_epoch, blob = rec.checkpoints[-1]
    assert final_epoch == spec.epochs

    # A worker lost during export or while storing the model: the next attempt resumes here.
    again = Recorder()
    resumed = train(
        spec, data_dir=data_dir, callbacks=again.callbacks(), resume=blob, history=rec.epochs
    )
    assert again.steps == [] and again.epochs == []  # nothing is trained twice
    assert resumed.epochs == first.epochs
    assert {k: resumed.summary()[k] for k in REPORTED} == {k: first.summary()[k] for k in REPORTED}
    assert resumed.images_per_second == first.epochs[-1].images_per_second > 0
    images = torch.rand(16, 1, 28, 28)
    assert torch.equal(logits(resumed, images), logits(first, images))


@pytest.mark.slow  # two training runs
def test_a_resume_after_the_target_accuracy_does_not_train_on(data_dir: Path) -> None:
    spec = JobSpec(epochs=3, batch_size=512, seed=3, target_accuracy=0.5)
    rec = Recorder()
    first = train(spec, data_dir=data_dir, callbacks=rec.callbacks())
    assert first.stopped_early == "target_accuracy" and len(first.epochs) == 1
    again = Recorder()
    resumed = train(
        spec,
        data_dir=data_dir,
        callbacks=again.callbacks(),
        resume=rec.checkpoints[-1][1],
        history=rec.epochs,
    )
    assert again.steps == []
    assert resumed.stopped_early == "target_accuracy"
    assert resumed.summary()["epochs"] == 1


@pytest.mark.slow
def test_a_data_set_of_constant_images_trains(tmp_path: Path) -> None:
    """Every pixel the same: the training pixels' std is 0, and normalising by it divided
    by zero. The run trains on what there is to learn (the class prior) instead."""
    name = f"ds:{uuid.uuid4()}"
    path = user_dataset_path(name, tmp_path)
    path.parent.mkdir(parents=True)
    labels = np.array([0, 0, 0, 1] * 16, dtype=np.int64)  # 3 of 4 images are class 0
    images = np.full((len(labels), 1, 8, 8), 200, dtype=np.uint8)
    np.savez(path, x_train=images, y_train=labels, x_test=images, y_test=labels)
    rec = Recorder()
    result = train(
        JobSpec(dataset=name, epochs=3, batch_size=16, lr=0.01),
        data_dir=tmp_path,
        callbacks=rec.callbacks(),
    )
    assert all(math.isfinite(p.loss) for p in rec.steps)
    assert math.isfinite(result.test_loss)
    assert result.test_accuracy == 0.75  # the majority class, the best a constant input allows
    out = logits(result, torch.full((2, 1, 8, 8), 200 / 255))
    assert torch.isfinite(out).all() and out.argmax(1).tolist() == [0, 0]


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_checkpoint_resumes_whichever_optimizer_kind_wrote_it(
    data_dir: Path, optimizer: str
) -> None:
    """A CPU worker's checkpoint (a foreach optimizer, no scaler state) resumed where the
    run builds a fused optimizer and an fp16 scaler (a CUDA worker), mirrored on the CPU,
    where fused optimizers and the scaler run too."""
    spec = JobSpec(epochs=1, batch_size=512, amp="off", optimizer=optimizer, scheduler="none")
    data = load_dataset(spec.dataset, data_dir)
    dev = torch.device("cpu")
    old = Run(spec, dev, None, data)  # a CPU worker's: foreach, its scaler disabled
    x, y = next(iter(old.batches.epoch(1)))
    old.step(x, y)
    new = Run(spec, dev, None, data)
    kind = torch.optim.SGD if optimizer == "sgd" else torch.optim.AdamW
    extra = {"momentum": spec.momentum} if optimizer == "sgd" else {}
    new.optimizer = kind(new.model.parameters(), lr=spec.lr, fused=True, **extra)
    new.scheduler = torch.optim.lr_scheduler.LambdaLR(new.optimizer, lambda _: 1.0)
    new.scaler = torch.amp.GradScaler("cpu", enabled=True)
    new.load_checkpoint(read_saved(old.checkpoint(1, 1), dev))
    loss, _ = new.step(x, y)
    assert math.isfinite(loss.item())
    assert new.optimizer.param_groups[0]["fused"]

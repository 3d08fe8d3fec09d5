"""Preemption in the trainer: a run stopped at step k writes a mid-epoch checkpoint, and the
resume from it trains exactly what the uninterrupted run trains after step k. On the CPU,
where every kernel is deterministic, so "exactly" means bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.errors import TrainingPreempted
from core.spec import JobSpec
from core.train import train
from tests.conftest import Recorder
from tests.preemption import epoch_figures, preempted_at, steps, weights

SPEC = JobSpec(epochs=2, batch_size=512, seed=3)  # 8 steps an epoch on mnist-sample
DATALOADER = JobSpec(epochs=2, batch_size=512, seed=3, data_path="dataloader", num_workers=0)


@pytest.fixture(scope="module")
def uninterrupted(data_dir: Path) -> dict[JobSpec, Recorder]:
    runs = {}
    for spec in (SPEC, DATALOADER):
        rec = Recorder()
        train(spec, data_dir=data_dir, device="cpu", callbacks=rec.callbacks())
        runs[spec] = rec
    return runs


@pytest.mark.slow  # over 10 s: the full run, not --fast
@pytest.mark.parametrize(
    ("spec", "k"),
    [(SPEC, 3), (SPEC, 8), (SPEC, 13), (DATALOADER, 11)],
    ids=["epoch1-step3", "epoch-boundary", "epoch2-step13", "dataloader-step11"],
)
def test_a_mid_epoch_resume_ends_with_the_weights_of_an_uninterrupted_run(
    spec: JobSpec, k: int, data_dir: Path, uninterrupted: dict[JobSpec, Recorder]
) -> None:
    whole = uninterrupted[spec]
    first = Recorder()
    with pytest.raises(TrainingPreempted) as stop:
        train(spec, data_dir=data_dir, device="cpu", callbacks=preempted_at(k, first))
    assert stop.value.step == k
    assert steps(first) == steps(whole)[:k]  # every step before the stop reached on_steps

    second = Recorder()
    train(
        spec,
        data_dir=data_dir,
        device="cpu",
        callbacks=second.callbacks(),
        resume=stop.value.checkpoint,
    )
    # No finished step is repeated, none is skipped, and each is the same step.
    assert steps(second) == steps(whole)[k:]
    # The interrupted epoch's train loss and accuracy count every batch once.
    assert epoch_figures(first) + epoch_figures(second) == epoch_figures(whole)
    final, expected = weights(second.checkpoints[-1][1]), weights(whole.checkpoints[-1][1])
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[name], expected[name]) for name in expected)

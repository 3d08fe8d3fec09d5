"""Preemption in the trainer: a run stopped at step k writes a mid-epoch checkpoint, and the
resume from it trains exactly what the uninterrupted run trains after step k. On the CPU,
where every kernel is deterministic, so "exactly" means bit for bit."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from core.errors import TrainingPreempted
from core.spec import JobSpec
from core.train import Callbacks, train
from tests.conftest import Recorder

SPEC = JobSpec(epochs=2, batch_size=512, seed=3)  # 8 steps an epoch on mnist-sample
DATALOADER = JobSpec(epochs=2, batch_size=512, seed=3, data_path="dataloader", num_workers=0)


def preempted_at(k: int, rec: Recorder) -> Callbacks:
    """Callbacks that ask for preemption right after step k (the check precedes each step)."""
    calls = 0

    def should_preempt() -> bool:
        nonlocal calls
        calls += 1
        return calls > k

    cb = rec.callbacks()
    cb.should_preempt = should_preempt
    return cb


def weights(checkpoint: bytes) -> dict[str, torch.Tensor]:
    """The model's weights and their moving average (what is evaluated and exported)."""
    state = torch.load(io.BytesIO(checkpoint), weights_only=True)
    ema = {f"ema.{k}": v for k, v in state["ema"]["module"].items()}
    return {**state["model"], **ema, "ema.updates": torch.tensor(state["ema"]["updates"])}


def epoch_figures(rec: Recorder) -> list[tuple[int, int, float, float, float, float]]:
    return [
        (e.epoch, e.step, e.train_loss, e.train_accuracy, e.test_loss, e.test_accuracy)
        for e in rec.epochs
    ]


def steps(rec: Recorder) -> list[tuple[int, int, float, float]]:
    return [(p.step, p.epoch, p.loss, p.lr) for p in rec.steps]


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

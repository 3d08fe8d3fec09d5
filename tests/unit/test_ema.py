"""The weights' moving average: warmed up for short runs, every float tensor averaged, the
integer ones copied, and what evaluation and export see."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from core.spec import JobSpec
from core.train.data import load_dataset
from core.train.ema import Ema
from core.train.run import Run, read_saved


def test_the_first_updates_follow_the_weights_closely_then_the_decay_holds() -> None:
    model = nn.Linear(3, 1)
    ema = Ema(model, decay=0.999)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update()  # decay min(0.999, 2/11)
    expected = start + (1 - 2 / 11) * 1.0
    torch.testing.assert_close(ema.module.weight, expected)
    for _ in range(10_000):
        ema.update()
    assert ema.current_decay() == 0.999
    torch.testing.assert_close(ema.module.weight, model.weight)  # converged


def test_batchnorm_statistics_are_averaged_and_its_count_copied() -> None:
    model = nn.BatchNorm1d(2)
    ema = Ema(model, decay=0.9)
    model.train()
    model(torch.randn(8, 2) + 5)
    ema.update()
    assert ema.module.num_batches_tracked == model.num_batches_tracked == 1
    assert 0 < float(ema.module.running_mean[0]) < float(model.running_mean[0])


def test_state_round_trips() -> None:
    model = nn.Linear(2, 2)
    ema = Ema(model, decay=0.99)
    ema.update()
    other = Ema(nn.Linear(2, 2), decay=0.99)
    other.load_state_dict(ema.state_dict())
    assert other.updates == 1
    torch.testing.assert_close(other.module.weight, ema.module.weight)


def test_the_run_evaluates_the_average_and_none_means_the_raw_weights(data_dir: Path) -> None:
    data = load_dataset("mnist-sample", data_dir)
    run = Run(JobSpec(batch_size=256), torch.device("cpu"), None, data)
    for x, y in list(run.batches.epoch(1))[:4]:
        run.step(x, y)
    assert run.ema is not None and run.eval_model is run.ema.module
    raw, avg = run.model.fc2.weight, run.eval_model.fc2.weight
    assert not torch.equal(raw, avg)
    plain = Run(JobSpec(ema_decay=None), torch.device("cpu"), None, data)
    assert plain.ema is None and plain.eval_model is plain.model


@pytest.mark.parametrize("decay", [0.4, 1.0])
def test_a_decay_outside_its_bounds_is_refused(decay: float) -> None:
    with pytest.raises(ValueError, match="ema_decay"):
        JobSpec(ema_decay=decay)


def test_a_checkpoint_without_an_average_restarts_it_at_its_weights(data_dir: Path) -> None:
    """A checkpoint from a run that did not average (ema_decay null, or written before
    averaging existed) resumed with averaging: the average starts at the checkpoint's
    weights, never at the new run's random ones (which a final checkpoint would export)."""
    data = load_dataset("mnist-sample", data_dir)
    before = Run(JobSpec(ema_decay=None, batch_size=256), torch.device("cpu"), None, data)
    for x, y in list(before.batches.epoch(1))[:3]:
        before.step(x, y)
    blob = before.checkpoint(1, 3)
    after = Run(JobSpec(batch_size=256, seed=9), torch.device("cpu"), None, data)
    after.load_checkpoint(read_saved(blob, torch.device("cpu")))
    assert after.ema is not None and after.ema.updates == 0
    expected = before.model.state_dict()
    got = after.eval_model.state_dict()
    assert all(torch.equal(got[k], expected[k]) for k in expected)

from __future__ import annotations

import io
import itertools
import math
import warnings
from pathlib import Path

import pytest
import torch

from core.errors import InvalidSpec, TrainingDiverged, TrainingStopped, TrainingTimeout
from core.spec import Amp, JobSpec
from core.train import Callbacks, TrainResult, train
from core.train.data import load_dataset
from core.train.run import Run
from tests.conftest import Recorder, cuda


@pytest.mark.slow
def test_default_spec_reaches_97_percent_in_5_epochs(data_dir: Path) -> None:
    rec = Recorder()
    result = train(JobSpec(epochs=5), data_dir=data_dir, callbacks=rec.callbacks())
    assert result.test_accuracy >= 0.97, [e.test_accuracy for e in result.epochs]
    assert len(rec.epochs) == 5
    assert rec.epochs[-1].train_loss < rec.epochs[0].train_loss


def test_every_step_reaches_on_steps_once_in_order(
    two_epochs: tuple[TrainResult, Recorder],
) -> None:
    result, rec = two_epochs
    assert [p.step for p in rec.steps] == list(range(1, result.steps + 1))
    assert result.steps == 2 * math.ceil(4000 / 64)
    assert all(math.isfinite(p.loss) and p.loss > 0 for p in rec.steps)
    assert all(p.images_per_second > 0 for p in rec.steps)
    assert [p.epoch for p in rec.steps][:: math.ceil(4000 / 64)] == [1, 2]
    # The cosine schedule: from lr down towards min_lr, step by step.
    lrs = [p.lr for p in rec.steps]
    assert lrs[0] == pytest.approx(1e-3)
    assert all(a >= b for a, b in itertools.pairwise(lrs))
    assert lrs[-1] < 2e-5
    # No CUDA here: memory stats are reported as zeros, not left out.
    if not torch.cuda.is_available():
        assert {(p.memory_allocated, p.memory_reserved, p.memory_peak) for p in rec.steps} == {
            (0, 0, 0)
        }


def test_a_checkpoint_per_epoch_and_a_complete_run_record(
    two_epochs: tuple[TrainResult, Recorder],
) -> None:
    result, rec = two_epochs
    assert [e for e, _ in rec.checkpoints] == [1, 2]
    record = result.record
    assert record["spec"] == JobSpec(epochs=2).model_dump(mode="json")
    assert record["versions"]["torch"] == torch.__version__
    assert len(record["dataset"]["sha256"]) == 64
    assert record["result"]["test_accuracy"] == result.test_accuracy
    assert record["device"]["type"] in ("cpu", "cuda")


def small(**kw: object) -> JobSpec:
    return JobSpec.model_validate({"epochs": 1, "max_steps": 6, **kw})


def weights_after(spec: JobSpec, data_dir: Path) -> dict[str, torch.Tensor]:
    rec = Recorder()
    train(spec, data_dir=data_dir, callbacks=rec.callbacks())
    return torch.load(io.BytesIO(rec.checkpoints[-1][1]), weights_only=True)["model"]


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_same_seed_same_weights_on_cpu(data_dir: Path) -> None:
    a = weights_after(small(seed=7), data_dir)
    b = weights_after(small(seed=7), data_dir)
    c = weights_after(small(seed=8), data_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_resume_from_a_checkpoint_matches_an_uninterrupted_run(data_dir: Path) -> None:
    spec = JobSpec(epochs=2, batch_size=512, seed=3)
    whole = Recorder()
    train(spec, data_dir=data_dir, callbacks=whole.callbacks())
    resumed = Recorder()
    train(spec, data_dir=data_dir, callbacks=resumed.callbacks(), resume=whole.checkpoints[0][1])
    assert [p.step for p in resumed.steps] == [p.step for p in whole.steps if p.epoch == 2]
    assert [p.loss for p in resumed.steps] == [p.loss for p in whole.steps if p.epoch == 2]
    assert resumed.epochs[0].test_accuracy == whole.epochs[1].test_accuracy


@pytest.mark.slow  # several seconds of training: the full run, not --fast
@pytest.mark.parametrize("amp", [Amp.off, Amp.bf16, Amp.auto])
def test_amp_modes_train_on_this_device(amp: Amp, data_dir: Path) -> None:
    result = train(small(amp=amp), data_dir=data_dir)
    assert result.steps == 6
    assert math.isfinite(result.train_loss)


def test_fp16_without_cuda_is_refused_naming_amp(data_dir: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(InvalidSpec) as exc:
        train(small(amp="fp16"), data_dir=data_dir)
    assert exc.value.field == "amp"


def test_gradscaler_unscales_before_clipping(data_dir: Path) -> None:
    """scale -> backward -> unscale -> clip -> step -> update: the clipped gradients must
    have the clip norm in true units, not in the scaler's 65536x units."""
    spec = small(grad_clip_norm=0.01, amp="off", channels_last=False)
    data = load_dataset(spec.dataset, data_dir)
    run = Run(spec, torch.device("cpu"), torch.float16, data)  # CPU fp16 autocast + scaler
    assert run.scaler.is_enabled()
    x, y = next(run.batches.epoch(1))
    loss, _ = run.step(x, y)
    norm = torch.norm(torch.stack([p.grad.norm() for p in run.model.parameters()]))
    assert float(norm) == pytest.approx(0.01, rel=1e-3)
    assert run.scaler.get_scale() > 0 and math.isfinite(float(loss))


@pytest.mark.slow  # several seconds of training: the full run, not --fast
def test_gradient_checkpointing_and_no_channels_last_train(data_dir: Path) -> None:
    result = train(small(gradient_checkpointing=True, channels_last=False), data_dir=data_dir)
    assert result.steps == 6


@pytest.mark.slow  # over 10 s: the full run, not --fast
@pytest.mark.parametrize("workers", [0, 1])
def test_the_articles_dataloader_path_trains(workers: int, data_dir: Path) -> None:
    spec = small(data_path="dataloader", num_workers=workers, persistent_workers=workers > 0)
    rec = Recorder()
    result = train(spec, data_dir=data_dir, callbacks=rec.callbacks())
    assert [p.step for p in rec.steps] == list(range(1, 7))
    assert math.isfinite(result.train_loss)


def test_should_stop_stops_between_steps(data_dir: Path) -> None:
    seen: list[int] = []
    cb = Callbacks(on_steps=lambda pts: seen.extend(p.step for p in pts))
    calls = iter(range(100))
    cb.should_stop = lambda: next(calls) >= 3
    with pytest.raises(TrainingStopped):
        train(JobSpec(epochs=1), data_dir=data_dir, callbacks=cb)
    assert seen == [1, 2, 3]


def test_max_duration_raises_timeout(data_dir: Path) -> None:
    with pytest.raises(TrainingTimeout):
        train(JobSpec(epochs=3, max_duration_s=0.05), data_dir=data_dir)


def test_a_diverging_run_stops_without_writing_nan(data_dir: Path) -> None:
    rec = Recorder()
    # fp32: under bf16 autocast (a CPU with AVX-512 BF16) the loss can stay finite at 1e20.
    spec = JobSpec(epochs=1, optimizer="sgd", lr=10, momentum=0.99, scheduler="none", amp="off")
    with pytest.raises(TrainingDiverged, match="step"):
        train(spec, data_dir=data_dir, callbacks=rec.callbacks(), flush_steps=4)
    assert all(math.isfinite(p.loss) for p in rec.steps)
    # Where the train losses stay finite, the evaluated weights overflow: no NaN epoch either.
    assert all(math.isfinite(e.test_loss) for e in rec.epochs)


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_target_accuracy_stops_early(data_dir: Path) -> None:
    result = train(JobSpec(epochs=5, target_accuracy=0.5), data_dir=data_dir)
    assert result.stopped_early == "target_accuracy"
    assert len(result.epochs) < 5


@cuda
def test_fp16_with_gradscaler_on_cuda_reports_memory(data_dir: Path) -> None:
    rec = Recorder()
    train(small(amp="fp16", grad_clip_norm=1.0), data_dir=data_dir, callbacks=rec.callbacks())
    assert all(p.memory_allocated > 0 and p.memory_peak >= p.memory_allocated for p in rec.steps)


@cuda
def test_fp16_steps_do_not_wait_for_the_gpu(data_dir: Path) -> None:
    """The host runs ahead of the GPU: no step reads a device value (GradScaler's inf check
    included), so an epoch's syncs are its flushes and its evaluation, not one per step."""
    cb = Callbacks(
        on_start=lambda _: torch.cuda.set_sync_debug_mode("warn"),
        on_epoch=lambda _: torch.cuda.set_sync_debug_mode("default"),
    )
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = train(small(amp="fp16", max_steps=None), data_dir=data_dir, callbacks=cb)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert result.steps == math.ceil(4000 / 64)
    assert len(syncs) < result.steps // 2, [str(w.message) for w in syncs[:3]]


@cuda
def test_compile_trains_on_cuda(data_dir: Path) -> None:
    result = train(small(compile=True, max_steps=20), data_dir=data_dir)
    assert math.isfinite(result.train_loss)

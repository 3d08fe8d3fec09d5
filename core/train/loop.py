"""The training loop: one mixed-precision path, no host sync per step, callbacks out.

`train` reads as the run: load the data and build the run (or restore it from a
checkpoint), train epoch after epoch until the spec says stop, then export and verify.
See docs/performance.md."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from core.errors import InvalidSpec, OutOfMemory, TrainingDiverged
from core.spec import JobSpec
from core.train.data import load_dataset
from core.train.device import (
    amp_name,
    device_name,
    is_out_of_memory,
    resolve_amp,
    resolve_device,
)
from core.train.epoch import Limits, train_epoch
from core.train.export import VERIFY_TIMEOUT_S, Exports, export_models
from core.train.kept_data import KEPT
from core.train.metrics import Callbacks, EpochMetrics, RunInfo, TrainResult
from core.train.normalization import kept
from core.train.progress import EpochStats
from core.train.record import run_record
from core.train.run import Run, no_progress, read_saved


def train(
    spec: JobSpec,
    *,
    data_dir: Path,
    device: str = "auto",
    callbacks: Callbacks | None = None,
    resume: bytes | None = None,
    history: Sequence[EpochMetrics] = (),
    start_weights: bytes | None = None,
    download: bool = False,
    flush_steps: int = 64,
    flush_seconds: float = 0.2,
    export_check_timeout_s: float = VERIFY_TIMEOUT_S,
) -> TrainResult:
    """Train `spec` on `device` and return its models, in the formats the spec asks for and
    each verified, with its metrics.

    `history` holds the epochs the run of a `resume` checkpoint already finished: the result
    speaks of the whole run, and a checkpoint that ended the run (a worker lost during
    export) is exported and reported without training again. `start_weights` (the weights
    of the job `spec.init_from` names, Run.weights) start a run that has no checkpoint yet.

    Raises the named errors of core.errors: InvalidSpec, DatasetNotFound, TrainingStopped,
    TrainingPreempted, TrainingTimeout, TrainingDiverged, OutOfMemory, ExportMismatch.
    """
    cb = callbacks or Callbacks()
    dev = resolve_device(device)
    started = time.perf_counter()
    run, start_epoch, step, timings = _start(
        spec, dev, data_dir, cb, (resume, start_weights), download
    )
    limits = _limits(spec, len(run.batches), started, flush_steps, flush_seconds)
    if cb.on_start:
        cb.on_start(_run_info(run, limits, step))
    done = [m for m in history if m.epoch < start_epoch]  # what the checkpoint's run finished
    with _named_oom(spec, dev):
        training = time.perf_counter()
        trained = _train_epochs(run, start_epoch, step, cb, limits, done)
        timings["train_s"] = time.perf_counter() - training
        _require_history(done)
        exports = export_models(
            run.eval_model,
            run.data,
            spec.export,
            run.progress,
            check_timeout_s=export_check_timeout_s,
        )
    timings["export_s"] = exports.seconds
    return _result(run, done, trained, limits, exports, timings, time.perf_counter() - started)


def _require_history(done: list[EpochMetrics]) -> None:
    if not done:
        raise InvalidSpec(
            "epochs",
            "the checkpoint given to resume from already ended the run, and the run's "
            "epoch metrics (history) were not given",
        )


def _start(
    spec: JobSpec,
    dev: torch.device,
    data_dir: Path,
    cb: Callbacks,
    start: tuple[bytes | None, bytes | None],
    download: bool,
) -> tuple[Run, int, int, dict[str, float]]:
    """The run, built and restored from its checkpoint, or else started from the weights
    init_from names (`start`: the two): with the epoch to train next, the last step done,
    and the seconds its data and the rest of its setup took."""
    resume, start_weights = start
    started = time.perf_counter()
    amp_dtype = resolve_amp(spec.amp, dev)
    if spec.compile and dev.type == "cpu" and spec.gradient_checkpointing:
        raise InvalidSpec("compile", "compile with gradient_checkpointing is CUDA-only here")
    torch.manual_seed(spec.seed)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes: autotune the convs once
        torch.set_float32_matmul_precision("high")
    progress = cb.on_progress or no_progress
    with _named_oom(spec, dev):
        loading = time.perf_counter()
        data = load_dataset(spec.dataset, data_dir, download=download)
        data_s = time.perf_counter() - loading
        progress()
        checkpoint = None if resume is None else read_saved(resume, dev)
        starts_from = resume is None and spec.init_from is not None
        weights = None
        if starts_from and start_weights is not None:
            weights = read_saved(start_weights, dev)
        # A start trained on another normalisation keeps it (core.train.normalization).
        norm = kept(data.normalization, checkpoint, weights)
        run = Run(spec, dev, amp_dtype, data, progress, norm)
        progress()
        start_epoch, step = (1, 0) if checkpoint is None else run.load_checkpoint(checkpoint)
        if starts_from:
            run.start_from(weights)
        progress()
    return (
        run,
        start_epoch,
        step,
        {"data_s": data_s, "setup_s": time.perf_counter() - started - data_s},
    )


def _limits(
    spec: JobSpec, steps_per_epoch: int, started: float, flush_steps: int, flush_seconds: float
) -> Limits:
    """When the run stops (its steps, its deadline) and how often it reports its steps."""
    return Limits(
        total_steps=_total_steps(spec, steps_per_epoch),
        deadline=None if spec.max_duration_s is None else started + spec.max_duration_s,
        flush_steps=flush_steps,
        flush_seconds=flush_seconds,
    )


def _total_steps(spec: JobSpec, steps_per_epoch: int) -> int:
    total = spec.epochs * steps_per_epoch
    return total if spec.max_steps is None else min(total, spec.max_steps)


def _run_info(run: Run, limits: Limits, start_step: int) -> RunInfo:
    return RunInfo(
        device=device_name(run.dev),
        total_steps=limits.total_steps,
        steps_per_epoch=len(run.batches),
        start_step=start_step,
        amp=amp_name(run.amp_dtype),
    )


def _train_epochs(
    run: Run, start_epoch: int, step: int, cb: Callbacks, limits: Limits, done: list[EpochMetrics]
) -> EpochStats:
    """Epochs from `start_epoch` until the spec says stop, each appended to `done`, evaluated,
    reported and checkpointed. Returns the training figures of the epochs it trained."""
    trained = EpochStats(last_step=step, loss=0.0, accuracy=0.0, images=0, step_seconds=0.0)
    ended, _ = _run_ended(run.spec, done, limits.total_steps)
    for epoch in range(start_epoch, start_epoch if ended else run.spec.epochs + 1):
        t0 = time.perf_counter()
        stats = train_epoch(run, epoch, trained.last_step, cb, limits)
        trained = trained.then(stats)
        test_loss, test_acc, by_class = run.evaluate()
        if not math.isfinite(test_loss):
            # The train losses stayed finite, but the evaluated weights (their moving
            # average, or the last step's) overflowed: stop before NaN reaches the metrics.
            raise TrainingDiverged(
                f"the test loss became {test_loss} at step {stats.last_step} (epoch {epoch}); "
                "try a lower lr, grad_clip_norm, or amp 'bf16'/'off'"
            )
        metrics = EpochMetrics(
            epoch=epoch,
            step=stats.last_step,
            train_loss=stats.loss,
            train_accuracy=stats.accuracy,
            test_loss=test_loss,
            test_accuracy=test_acc,
            duration_s=time.perf_counter() - t0 + stats.earlier_s,
            images_per_second=stats.images / max(stats.step_seconds, 1e-9),
            class_metrics=by_class,
        )
        done.append(metrics)
        if cb.on_epoch:
            cb.on_epoch(metrics)
        if cb.on_checkpoint:
            cb.on_checkpoint(epoch, run.checkpoint(epoch, stats.last_step))
        if _run_ended(run.spec, done, limits.total_steps)[0]:
            break
    return trained


def _result(
    run: Run,
    done: list[EpochMetrics],
    trained: EpochStats,
    limits: Limits,
    exports: Exports,
    timings: dict[str, float],
    duration: float,
) -> TrainResult:
    last = done[-1]
    result = TrainResult(
        epochs=done,
        steps=trained.last_step,
        test_accuracy=last.test_accuracy,
        test_loss=last.test_loss,
        train_loss=last.train_loss,
        # A resume with nothing left to train reports the rate its last epoch trained at.
        images_per_second=(
            trained.images / trained.step_seconds
            if trained.step_seconds > 0
            else last.images_per_second
        ),
        duration_s=duration,
        models=exports.models,
        record={},
        stopped_early=_run_ended(run.spec, done, limits.total_steps)[1],
    )
    result.record = run_record(run.spec, run.dev, run.data, result.summary(), run.amp_dtype)
    result.record["formats"] = exports.report
    result.record["export_s"] = round(exports.seconds, 3)
    # Where the run's time went; each format's export and check are in record["formats"].
    result.record["timings"] = {k: round(v, 3) for k, v in timings.items()}
    result.record["data_kept"] = KEPT.holds(run.data)  # its worker read it after an earlier job
    result.weights = run.weights()
    return result


def _run_ended(
    spec: JobSpec, done: Sequence[EpochMetrics], total_steps: int
) -> tuple[bool, str | None]:
    """Whether the run ends after its last finished epoch, and why early if it did."""
    if not done:
        return False, None
    last = done[-1]
    if spec.target_accuracy is not None and last.test_accuracy >= spec.target_accuracy:
        return True, "target_accuracy"
    if last.step >= total_steps:
        return True, "max_steps" if last.epoch < spec.epochs else None
    return last.epoch >= spec.epochs, None


@contextmanager
def _named_oom(spec: JobSpec, dev: torch.device) -> Iterator[None]:
    """Out of memory anywhere in the run (model build, data placement, steps, evaluation,
    export) is the user's OutOfMemory, with figures and advice; it is never retried."""
    try:
        yield
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        raise OutOfMemory(_oom_message(spec, dev)) from e


def _oom_message(spec: JobSpec, dev: torch.device) -> str:
    figures = ""
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        figures = (
            f" (peak allocated {torch.cuda.max_memory_allocated(dev) / 2**30:.2f} GiB, "
            f"free {free / 2**30:.2f} of {total / 2**30:.2f} GiB)"
        )
    return (
        f"out of memory at batch_size {spec.batch_size}{figures}. Try a smaller batch_size, "
        "amp 'bf16' or 'fp16', gradient_checkpointing, or narrower conv/hidden widths."
    )

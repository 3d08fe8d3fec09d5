"""The training loop: one mixed-precision path, no host sync per step, callbacks out."""

from __future__ import annotations

import io
import itertools
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from core.errors import (
    InvalidSpec,
    OutOfMemory,
    TrainingDiverged,
    TrainingPreempted,
    TrainingStopped,
    TrainingTimeout,
)
from core.spec import DataPath, JobSpec, Optimizer, Scheduler
from core.train.data import Dataset, ResidentBatches, load_dataset, loader_batches
from core.train.device import device_name, resolve_amp, resolve_device
from core.train.export import export_torchscript
from core.train.model import Net
from core.train.record import run_record


@dataclass(frozen=True, slots=True)
class StepMetrics:
    step: int  # 1-based, counted over the whole run
    epoch: int  # 1-based
    loss: float
    lr: float  # the learning rate this step used
    images_per_second: float
    memory_allocated: int  # bytes; 0 on the CPU
    memory_reserved: int
    memory_peak: int
    time: float  # unix time at the end of the step


@dataclass(frozen=True, slots=True)
class EpochMetrics:
    epoch: int
    step: int  # the last step of this epoch
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    duration_s: float  # training steps and evaluation
    images_per_second: float  # training steps only


@dataclass(frozen=True, slots=True)
class RunInfo:
    device: str
    total_steps: int
    steps_per_epoch: int
    start_step: int  # > 0 when resumed from a checkpoint
    amp: str


@dataclass
class Callbacks:
    """All optional. `on_steps` receives every step exactly once, in order, in blocks."""

    on_start: Callable[[RunInfo], None] | None = None
    on_steps: Callable[[Sequence[StepMetrics]], None] | None = None
    on_epoch: Callable[[EpochMetrics], None] | None = None
    on_checkpoint: Callable[[int, bytes], None] | None = None  # (epoch, checkpoint bytes)
    should_stop: Callable[[], bool] | None = None  # checked between steps
    # Called as each piece of step-free work ends (data load and placement, model build,
    # checkpoint load, each evaluation batch, export): with `on_steps` and the others it
    # tells a watcher that a slow phase is still moving, and silence that it is hung.
    on_progress: Callable[[], None] | None = None
    # Checked between steps too: True stops the run with a mid-epoch checkpoint
    # (TrainingPreempted), from which a resume continues at the next step.
    should_preempt: Callable[[], bool] | None = None


@dataclass
class TrainResult:
    epochs: list[EpochMetrics]
    steps: int
    test_accuracy: float
    test_loss: float
    train_loss: float
    images_per_second: float
    duration_s: float
    model: bytes  # TorchScript, verified by reload
    model_sha256: str
    record: dict[str, Any]
    stopped_early: str | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "test_accuracy": self.test_accuracy,
            "test_loss": self.test_loss,
            "train_loss": self.train_loss,
            "images_per_second": self.images_per_second,
            "duration_s": self.duration_s,
            "epochs": len(self.epochs),
            "steps": self.steps,
            "stopped_early": self.stopped_early,
        }


class Batches(Protocol):
    def __len__(self) -> int: ...
    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


def train(
    spec: JobSpec,
    *,
    data_dir: Path,
    device: str = "auto",
    callbacks: Callbacks | None = None,
    resume: bytes | None = None,
    history: Sequence[EpochMetrics] = (),
    download: bool = False,
    flush_steps: int = 64,
    flush_seconds: float = 0.2,
) -> TrainResult:
    """Train `spec` on `device` and return the verified TorchScript model with its metrics.

    `history` holds the epochs the run of a `resume` checkpoint already finished: the result
    speaks of the whole run, and a checkpoint that ended the run (a worker lost during
    export) is exported and reported without training again.

    Raises the named errors of core.errors: InvalidSpec, DatasetNotFound, TrainingStopped,
    TrainingPreempted, TrainingTimeout, TrainingDiverged, OutOfMemory, ExportMismatch.
    """
    cb = callbacks or Callbacks()
    dev = resolve_device(device)
    amp_dtype = resolve_amp(spec.amp, dev)
    if spec.compile and dev.type == "cpu" and spec.gradient_checkpointing:
        raise InvalidSpec("compile", "compile with gradient_checkpointing is CUDA-only here")
    started = time.perf_counter()
    deadline = None if spec.max_duration_s is None else started + spec.max_duration_s
    torch.manual_seed(spec.seed)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes: autotune the convs once
        torch.set_float32_matmul_precision("high")

    progress = cb.on_progress or _no_progress
    with _named_oom(spec, dev):
        data = load_dataset(spec.dataset, data_dir, download=download)
        progress()
        run = _Run(spec, dev, amp_dtype, data, progress)
        progress()
        start_epoch, step = (1, 0) if resume is None else run.load_checkpoint(resume)
        progress()
    total_steps = spec.epochs * len(run.batches)
    if spec.max_steps is not None:
        total_steps = min(total_steps, spec.max_steps)
    if cb.on_start:
        cb.on_start(
            RunInfo(
                device=device_name(dev),
                total_steps=total_steps,
                steps_per_epoch=len(run.batches),
                start_step=step,
                amp=str(amp_dtype).removeprefix("torch.") if amp_dtype else "off",
            )
        )

    done = [m for m in history if m.epoch < start_epoch]  # what the checkpoint's run finished
    ended, stopped_early = _run_ended(spec, done, total_steps)
    train_time = 0.0
    train_images = 0
    with _named_oom(spec, dev):
        for epoch in range(start_epoch, start_epoch if ended else spec.epochs + 1):
            t0 = time.perf_counter()
            stats = run.train_epoch(
                epoch, step, total_steps, cb, deadline, flush_steps, flush_seconds
            )
            step = stats.last_step
            train_time += stats.step_seconds
            train_images += stats.images
            test_loss, test_acc = run.evaluate()
            metrics = EpochMetrics(
                epoch=epoch,
                step=step,
                train_loss=stats.loss,
                train_accuracy=stats.accuracy,
                test_loss=test_loss,
                test_accuracy=test_acc,
                duration_s=time.perf_counter() - t0 + stats.earlier_s,
                images_per_second=stats.images / max(stats.step_seconds, 1e-9),
            )
            done.append(metrics)
            if cb.on_epoch:
                cb.on_epoch(metrics)
            if cb.on_checkpoint:
                cb.on_checkpoint(epoch, run.checkpoint(epoch, step))
            ended, stopped_early = _run_ended(spec, done, total_steps)
            if ended:
                break

        if not done:
            raise InvalidSpec(
                "epochs",
                "the checkpoint given to resume from already ended the run, and the run's "
                "epoch metrics (history) were not given",
            )
        model_bytes, sha = export_torchscript(run.model, data)
        progress()
    duration = time.perf_counter() - started
    last = done[-1]
    result = TrainResult(
        epochs=done,
        steps=step,
        test_accuracy=last.test_accuracy,
        test_loss=last.test_loss,
        train_loss=last.train_loss,
        # A resume with nothing left to train reports the rate its last epoch trained at.
        images_per_second=train_images / train_time if train_time > 0 else last.images_per_second,
        duration_s=duration,
        model=model_bytes,
        model_sha256=sha,
        record={},
        stopped_early=stopped_early,
    )
    result.record = run_record(spec, dev, data, result.summary(), amp_dtype)
    return result


def _no_progress() -> None:
    return None


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


def is_out_of_memory(e: BaseException) -> bool:
    """Out of memory on the device or the host, whichever allocator said it."""
    if isinstance(e, torch.OutOfMemoryError | MemoryError):
        return True
    # The CPU allocator's out-of-memory is a plain RuntimeError.
    return isinstance(e, RuntimeError) and "can't allocate memory" in str(e)


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


@dataclass
class _EpochStats:
    last_step: int
    loss: float
    accuracy: float
    images: int
    step_seconds: float
    earlier_s: float  # wall time of this epoch before its mid-epoch resume


@dataclass
class _EpochProgress:
    """How far an epoch has come. A mid-epoch checkpoint keeps it, so that a resume trains
    only the epoch's remaining batches and its train loss and accuracy count every batch once."""

    epoch: int
    position: int  # batches of this epoch already trained
    loss_sum: torch.Tensor  # sum of loss * batch size, on the device
    correct: torch.Tensor
    images: int = 0
    step_seconds: float = 0.0  # of the steps before a resume
    elapsed_s: float = 0.0  # wall time before a resume

    @classmethod
    def start(cls, epoch: int, dev: torch.device) -> _EpochProgress:
        zero = torch.zeros((), device=dev)
        return cls(epoch, 0, zero, torch.zeros((), dtype=torch.long, device=dev))

    def state(self, step_seconds: float, elapsed_s: float) -> dict[str, Any]:
        return {
            "position": self.position,
            "loss_sum": self.loss_sum,
            "correct": self.correct,
            "images": self.images,
            "step_seconds": self.step_seconds + step_seconds,
            "elapsed_s": self.elapsed_s + elapsed_s,
        }

    @classmethod
    def from_state(cls, epoch: int, state: dict[str, Any]) -> _EpochProgress:
        return cls(
            epoch=epoch,
            position=int(state["position"]),
            loss_sum=state["loss_sum"],
            correct=state["correct"],
            images=int(state["images"]),
            step_seconds=float(state["step_seconds"]),
            elapsed_s=float(state["elapsed_s"]),
        )


class _Run:
    """The state of one run: model, optimiser, schedule, scaler, batches."""

    def __init__(
        self,
        spec: JobSpec,
        dev: torch.device,
        amp_dtype: torch.dtype | None,
        data: Dataset,
        progress: Callable[[], None] = _no_progress,
    ) -> None:
        self.spec = spec
        self.dev = dev
        self.amp_dtype = amp_dtype
        self.data = data
        self.progress = progress
        c, h, w = data.image_shape
        self.model = Net(
            in_channels=c,
            image_size=(h, w),
            conv1=spec.conv1_channels,
            conv2=spec.conv2_channels,
            hidden=spec.hidden,
            num_classes=data.num_classes,
            gradient_checkpointing=spec.gradient_checkpointing,
        ).to(dev)
        if spec.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.forward: Callable[[torch.Tensor], torch.Tensor] = self.model
        if spec.compile:
            # On CUDA, "reduce-overhead" replays the step's ~60 kernels as one CUDA graph.
            mode = "reduce-overhead" if dev.type == "cuda" else None
            self.forward = torch.compile(self.model, mode=mode)
        self.batches = self._batches()
        self.criterion = nn.CrossEntropyLoss(label_smoothing=spec.label_smoothing)
        self.optimizer = self._optimizer()
        self.scheduler = self._scheduler(spec.epochs * len(self.batches))
        self.scaler = torch.amp.GradScaler(dev.type, enabled=amp_dtype is torch.float16)
        self.first_fp16_step = self.scaler.is_enabled()
        self.cuda_graphs = spec.compile and dev.type == "cuda"
        self.resumed: _EpochProgress | None = None  # set by a mid-epoch checkpoint

    def _batches(self) -> Batches:
        spec, data = self.spec, self.data
        if spec.data_path is DataPath.device:
            return ResidentBatches(
                data.train,
                self.dev,
                batch_size=spec.batch_size,
                mean=data.mean,
                std=data.std,
                channels_last=spec.channels_last,
                seed=spec.seed,
            )
        return loader_batches(
            data,
            self.dev,
            batch_size=spec.batch_size,
            channels_last=spec.channels_last,
            seed=spec.seed,
            num_workers=spec.num_workers,
            pin_memory=spec.pin_memory,
            persistent_workers=spec.persistent_workers,
            prefetch_factor=spec.prefetch_factor,
        )

    def _optimizer(self) -> torch.optim.Optimizer:
        spec = self.spec
        params = self.model.parameters()
        # On CUDA the fused update is a few kernels for all parameters, and it takes the fp16
        # scaler's inf check on the device: a foreach optimizer makes GradScaler.step read
        # that check on the host, a sync every step. On the CPU, foreach.
        fused = self.dev.type == "cuda"
        foreach = not fused
        if spec.optimizer is Optimizer.sgd:
            return torch.optim.SGD(
                params,
                lr=spec.lr,
                momentum=spec.momentum,
                weight_decay=spec.weight_decay,
                foreach=foreach,
                fused=fused,
            )
        return torch.optim.AdamW(
            params, lr=spec.lr, weight_decay=spec.weight_decay, foreach=foreach, fused=fused
        )

    def _scheduler(self, total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
        spec = self.spec
        if spec.scheduler is Scheduler.cosine:
            # Stepped every batch: a smooth decay rather than the article's per-epoch stairs.
            return torch.optim.lr_scheduler.CosineAnnealingLR(
                self.optimizer, T_max=total_steps, eta_min=spec.min_lr
            )
        if spec.scheduler is Scheduler.onecycle:
            return torch.optim.lr_scheduler.OneCycleLR(
                self.optimizer, max_lr=spec.lr, total_steps=total_steps
            )
        return torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)

    def autocast(self) -> AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.dev.type, dtype=self.amp_dtype)

    def train_epoch(
        self,
        epoch: int,
        step: int,
        total_steps: int,
        cb: Callbacks,
        deadline: float | None,
        flush_steps: int,
        flush_seconds: float,
    ) -> _EpochStats:
        self.model.train()
        started = time.perf_counter()
        progress = self._progress_of(epoch)
        out = _StepBuffer(self.dev, flush_steps, cb.on_steps)
        # The order depends only on (seed, epoch): a mid-epoch resume skips what was trained.
        for x, y in itertools.islice(self.batches.epoch(epoch), progress.position, None):
            if step >= total_steps:
                break
            if cb.should_stop and cb.should_stop():
                out.flush()
                raise TrainingStopped(f"stopped by request at step {step}")
            if deadline is not None and time.perf_counter() > deadline:
                out.flush()
                raise TrainingTimeout(
                    f"max_duration_s {self.spec.max_duration_s} passed at step {step}"
                )
            if cb.should_preempt and cb.should_preempt():
                out.flush()
                within = progress.state(out.step_seconds, time.perf_counter() - started)
                raise TrainingPreempted(epoch, step, self.checkpoint(epoch, step, within))
            lr = float(self.scheduler.get_last_lr()[0])
            loss, logits = self._step(x, y)
            step += 1
            n = y.shape[0]
            progress.position += 1
            progress.images += n
            with torch.no_grad():
                progress.loss_sum += loss * n
                progress.correct += (logits.argmax(1) == y).sum()
            out.add(step, epoch, loss, lr, n)
            if out.due(flush_seconds):
                out.flush()
        out.flush()
        images = progress.images
        return _EpochStats(
            last_step=step,
            loss=progress.loss_sum.item() / max(images, 1),
            accuracy=progress.correct.item() / max(images, 1),
            images=images,
            step_seconds=progress.step_seconds + out.step_seconds,
            earlier_s=progress.elapsed_s,
        )

    def _progress_of(self, epoch: int) -> _EpochProgress:
        """The resumed epoch's progress from a mid-epoch checkpoint, or a fresh start."""
        resumed, self.resumed = self.resumed, None
        if resumed is not None and resumed.epoch == epoch:
            return resumed
        return _EpochProgress.start(epoch, self.dev)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cuda_graphs:
            # CUDA graphs reuse their output buffers: mark each step so a replay never
            # overwrites a tensor this step still reads.
            torch.compiler.cudagraph_mark_step_begin()
        with self.autocast():
            logits = self.forward(x)
            loss = self.criterion(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        # GradScaler order: scale -> backward -> unscale -> clip -> step -> update.
        # With fp16 off the scaler is a pass-through.
        self.scaler.scale(loss).backward()
        if self.spec.grad_clip_norm is not None:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.grad_clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._advance_schedule()
        return loss.detach(), logits.detach()

    def _advance_schedule(self) -> None:
        if self.first_fp16_step:
            # fp16: the scaler skips optimizer.step() when a step's gradients overflowed and the
            # schedule still advances (as torch's AMP recipe does); on the very first step torch
            # then warns that the order is wrong. It is not: keep that one warning quiet.
            self.first_fp16_step = False
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", "Detected call of `lr_scheduler.step", UserWarning
                )
                self.scheduler.step()
            return
        self.scheduler.step()

    @torch.inference_mode()
    def evaluate(self, batch_size: int = 2048) -> tuple[float, float]:
        self.model.eval()
        test = self.data.test
        mean, std = self.data.mean * 255.0, self.data.std * 255.0
        fmt = torch.channels_last if self.spec.channels_last else torch.contiguous_format
        images = test.images.to(self.dev)
        labels = test.labels.to(self.dev)
        loss_sum = torch.zeros((), device=self.dev)
        correct = torch.zeros((), dtype=torch.long, device=self.dev)
        for i in range(0, len(labels), batch_size):
            x = images[i : i + batch_size].float().sub_(mean).div_(std)
            y = labels[i : i + batch_size]
            with self.autocast():
                logits = self.model(x.contiguous(memory_format=fmt))
            loss_sum += nn.functional.cross_entropy(logits.float(), y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
            self.progress()
        n = len(labels)
        return loss_sum.item() / n, correct.item() / n

    def checkpoint(self, epoch: int, step: int, within: dict[str, Any] | None = None) -> bytes:
        """Everything a resume needs; the data order is derived from (seed, epoch). At the
        end of `epoch`, or inside it with `within` (an _EpochProgress state)."""
        state = {
            "epoch": epoch,
            "step": step,
            "spec": self.spec.model_dump(mode="json"),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "cpu_rng": torch.get_rng_state(),
        }
        if self.dev.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.dev)
        if within is not None:
            state["within_epoch"] = within
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    def load_checkpoint(self, blob: bytes) -> tuple[int, int]:
        """Restore a checkpoint; returns (the epoch to train next, the last step done)."""
        state = torch.load(io.BytesIO(blob), map_location=self.dev, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["cpu_rng"].cpu())
        if "cuda_rng" in state and self.dev.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"].cpu(), self.dev)
        epoch, step = int(state["epoch"]), int(state["step"])
        if "within_epoch" in state:
            self.resumed = _EpochProgress.from_state(epoch, state["within_epoch"])
            return epoch, step
        return epoch + 1, step


class _StepBuffer:
    """Per-step losses stay on the device; every `size` steps (or `due` seconds) they are
    copied out in one non-blocking transfer. Step times come from CUDA events on the GPU
    (no sync per step) and from the host clock on the CPU (where every op is synchronous)."""

    def __init__(
        self,
        dev: torch.device,
        size: int,
        sink: Callable[[Sequence[StepMetrics]], None] | None,
    ) -> None:
        self.dev = dev
        self.size = size
        self.sink = sink
        self.cuda = dev.type == "cuda"
        self.losses = torch.empty(size, device=dev)
        self.host = torch.empty(size, pin_memory=self.cuda)
        self.pending: list[tuple[int, int, float, int, tuple[int, int, int]]] = []
        self.step_seconds = 0.0
        self.last_flush = time.perf_counter()
        self.last_mark: Any = self._mark()
        self.marks: list[Any] = []

    def _mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def add(self, step: int, epoch: int, loss: torch.Tensor, lr: float, n: int) -> None:
        self.losses[len(self.pending)].copy_(loss, non_blocking=True)
        memory = (
            (
                torch.cuda.memory_allocated(self.dev),
                torch.cuda.memory_reserved(self.dev),
                torch.cuda.max_memory_allocated(self.dev),
            )
            if self.cuda
            else (0, 0, 0)
        )
        self.pending.append((step, epoch, lr, n, memory))
        self.marks.append(self._mark())

    def due(self, seconds: float) -> bool:
        return len(self.pending) >= self.size or time.perf_counter() - self.last_flush > seconds

    def flush(self) -> None:
        if not self.pending:
            return
        k = len(self.pending)
        self.host[:k].copy_(self.losses[:k], non_blocking=True)
        if self.cuda:
            # A non-blocking copy is done only once an event recorded AFTER it has completed:
            # the last step mark was recorded before the copy, so waiting on it could read the
            # pinned buffer before the copy lands (stale or uninitialised losses).
            copied = torch.cuda.Event()
            copied.record()
            copied.synchronize()
            durations = [a.elapsed_time(b) / 1000 for a, b in _pairs(self.last_mark, self.marks)]
        else:
            durations = [b - a for a, b in _pairs(self.last_mark, self.marks)]
        losses = self.host[:k].tolist()
        now = time.time()
        bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        points = [
            StepMetrics(
                step=step,
                epoch=epoch,
                loss=loss,
                lr=lr,
                images_per_second=n / max(dt, 1e-9),
                memory_allocated=mem[0],
                memory_reserved=mem[1],
                memory_peak=mem[2],
                time=now,
            )
            for (step, epoch, lr, n, mem), loss, dt in zip(
                self.pending[:bad], losses, durations, strict=False
            )
        ]
        self.step_seconds += sum(durations)
        self.last_mark = self.marks[-1]
        diverged = None if bad is None else (self.pending[bad][0], losses[bad])
        self.pending.clear()
        self.marks.clear()
        self.last_flush = time.perf_counter()
        if self.sink and points:
            self.sink(points)
        if diverged is not None:
            raise TrainingDiverged(
                f"the loss became {diverged[1]} at step {diverged[0]}; try a lower lr, "
                "grad_clip_norm, or amp 'bf16'/'off'"
            )


def _pairs(first: Any, rest: list[Any]) -> Iterator[tuple[Any, Any]]:
    prev = first
    for m in rest:
        yield prev, m
        prev = m

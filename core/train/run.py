"""The state of one run: model, optimiser, schedule, scaler and batches; one training step,
evaluation, and the checkpoint a resume starts from."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Any, Protocol

import torch
from torch import nn

from core.errors import InvalidSpec
from core.model_sizes import model_too_large
from core.spec import DataPath, JobSpec, Optimizer, Scheduler
from core.train.archs import build_model, classifier_parameters, freeze_backbone, start_from
from core.train.article_loader import loader_batches
from core.train.augment import augmenter
from core.train.class_metrics import ConfusionCounter
from core.train.data import Dataset, ResidentBatches, pixel_affine
from core.train.ema import Ema
from core.train.normalization import WEIGHTS_KEY, Normalization, choose, split_weights
from core.train.progress import EpochProgress


def no_progress() -> None:
    return None


class Batches(Protocol):
    def __len__(self) -> int: ...
    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


def read_saved(blob: bytes, dev: torch.device) -> dict[str, Any]:
    """A checkpoint (Run.checkpoint) or a job's weights (Run.weights) read back, onto `dev`,
    with weights_only: nothing in it runs."""
    saved: dict[str, Any] = torch.load(io.BytesIO(blob), map_location=dev, weights_only=True)
    return saved


class Run:
    """The state of one run: model, optimiser, schedule, scaler, batches. Its data is
    normalised as `kept` says where its start has one (core.train.normalization.kept),
    else as the spec chooses: `self.data.normalization`, read by every path."""

    def __init__(
        self,
        spec: JobSpec,
        dev: torch.device,
        amp_dtype: torch.dtype | None,
        data: Dataset,
        progress: Callable[[], None] = no_progress,
        kept: Normalization | None = None,
    ) -> None:
        self.spec = spec
        self.dev = dev
        self.amp_dtype = amp_dtype
        c, h, w = data.image_shape
        self.data = replace(data, normalization=choose(spec, data.normalization, c, kept))
        data = self.data
        self.progress = progress
        too_large = model_too_large(spec, (c, h, w), data.num_classes)
        if too_large:  # the API refuses it; a spec sent straight to the queue meets it here
            raise InvalidSpec("spec", too_large)
        self.model = build_model(spec, (c, h, w), data.num_classes).to(dev)
        if spec.freeze_backbone:
            freeze_backbone(self.model, spec.model)
        if spec.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.forward: Callable[[torch.Tensor], torch.Tensor] = self.model
        if spec.compile:
            # On CUDA, "reduce-overhead" replays the model's forward and backward kernels as
            # CUDA graphs (the optimizer's step runs outside them).
            mode = "reduce-overhead" if dev.type == "cuda" else None
            self.forward = torch.compile(self.model, mode=mode)
        self.batches = self._batches()
        self.criterion = nn.CrossEntropyLoss(label_smoothing=spec.label_smoothing)
        self.optimizer = self._optimizer()
        self.ema = None if spec.ema_decay is None else Ema(self.model, spec.ema_decay)
        self.scheduler = self._scheduler(spec.epochs * len(self.batches))
        self.scaler = torch.amp.GradScaler(dev.type, enabled=amp_dtype is torch.float16)
        self.first_fp16_step = self.scaler.is_enabled()
        self.cuda_graphs = spec.compile and dev.type == "cuda"
        self.resumed: EpochProgress | None = None  # set by a mid-epoch checkpoint

    def _batches(self) -> Batches:
        spec, data = self.spec, self.data
        order: dict[str, Any] = {
            "batch_size": spec.batch_size,
            "channels_last": spec.channels_last,
            "seed": spec.seed,
            "augment": augmenter(spec.augment),
        }
        if spec.data_path is DataPath.device:
            norm = data.normalization
            return ResidentBatches(data.train, self.dev, mean=norm.mean, std=norm.std, **order)
        return loader_batches(
            data,
            self.dev,
            num_workers=spec.num_workers,
            pin_memory=spec.pin_memory,
            persistent_workers=spec.persistent_workers,
            prefetch_factor=spec.prefetch_factor,
            **order,
        )

    def _optimizer(self) -> torch.optim.Optimizer:
        spec = self.spec
        # On CUDA the fused update is a few kernels for all parameters, and it takes the fp16
        # scaler's inf check on the device: a foreach optimizer makes GradScaler.step read
        # that check on the host, a sync every step. On the CPU, foreach.
        fused = self.dev.type == "cuda"
        common: dict[str, Any] = {
            "lr": spec.lr,
            "weight_decay": spec.weight_decay,
            "foreach": not fused,
            "fused": fused,
        }
        groups = self._parameter_groups()
        if spec.optimizer is Optimizer.sgd:
            return torch.optim.SGD(groups, momentum=spec.momentum, **common)
        return torch.optim.AdamW(groups, **common)

    def _parameter_groups(self) -> list[dict[str, Any]]:
        """One group of the parameters that learn; with backbone_lr_scale, the backbone's
        first at lr × scale, then the classifier's at lr (a frozen backbone learns nothing)."""
        learning = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if self.spec.backbone_lr_scale == 1:
            return [{"params": [p for _, p in learning]}]
        head = classifier_parameters(self.model, self.spec.model)
        backbone = [p for n, p in learning if n not in head]
        lr = self.spec.lr * self.spec.backbone_lr_scale
        classifier = {"params": [p for n, p in learning if n in head]}
        return [{"params": backbone, "lr": lr}, classifier] if backbone else [classifier]

    def start_from(self, saved: dict[str, Any] | None) -> list[str]:
        """Start from another run's trained weights (read_saved of its Run.weights; see
        core.train.archs.start_from): the names kept fresh. InvalidSpec on init_from when
        they are not of this architecture."""
        if saved is None:
            raise InvalidSpec("init_from", f"the weights of job {self.spec.init_from} are missing")
        weights, _ = split_weights(saved)  # its normalisation was chosen with the run
        try:
            fresh = start_from(self.model, self.spec.model, weights)
        except ValueError as e:
            raise InvalidSpec("init_from", f"job {self.spec.init_from}: {e}") from None
        if self.ema is not None:
            self.ema.restart()
        return fresh

    def weights(self) -> bytes:
        """The evaluated model's weights (a state_dict, fp32, on the CPU) and, under
        WEIGHTS_KEY, the normalisation they were trained on: what a later job starts from
        with init_from. Read back with torch.load(weights_only=True)."""
        state: dict[str, Any] = {k: v.detach().float().cpu() if v.is_floating_point() else v.cpu()
                                 for k, v in self.eval_model.state_dict().items()}  # fmt: skip
        state[WEIGHTS_KEY] = self.data.normalization.as_dict()
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    def _scheduler(self, total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
        spec = self.spec
        if spec.scheduler is Scheduler.cosine:
            # Stepped every batch: a smooth decay rather than the article's per-epoch stairs.
            return torch.optim.lr_scheduler.CosineAnnealingLR(
                self.optimizer, T_max=total_steps, eta_min=spec.min_lr
            )
        if spec.scheduler is Scheduler.onecycle:
            max_lr = [g["lr"] for g in self.optimizer.param_groups]
            return torch.optim.lr_scheduler.OneCycleLR(
                self.optimizer, max_lr=max_lr, total_steps=total_steps
            )
        return torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)

    @property
    def eval_model(self) -> nn.Module:
        """What is evaluated and exported: the weights' moving average, or the weights."""
        return self.model if self.ema is None else self.ema.module

    def autocast(self) -> AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.dev.type, dtype=self.amp_dtype)

    def progress_of(self, epoch: int) -> EpochProgress:
        """The resumed epoch's progress from a mid-epoch checkpoint, or a fresh start."""
        resumed, self.resumed = self.resumed, None
        if resumed is not None and resumed.epoch == epoch:
            return resumed
        return EpochProgress.start(epoch, self.dev)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
        if self.ema is not None:
            self.ema.update()
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
    def evaluate(self, batch_size: int = 2048) -> tuple[float, float, dict[str, Any]]:
        """Loss, accuracy and the class figures (core.train.class_metrics) on the test split."""
        model = self.eval_model
        model.eval()
        test = self.data.test
        norm = self.data.normalization
        shift, spread = pixel_affine(norm.mean, norm.std, self.dev)
        fmt = torch.channels_last if self.spec.channels_last else torch.contiguous_format
        images = test.images.to(self.dev)
        labels = test.labels.to(self.dev)
        loss_sum = torch.zeros((), device=self.dev)
        correct = torch.zeros((), dtype=torch.long, device=self.dev)
        confusion = ConfusionCounter(self.data.num_classes, self.dev)
        for i in range(0, len(labels), batch_size):
            x = images[i : i + batch_size].float().sub_(shift).div_(spread)
            y = labels[i : i + batch_size]
            with self.autocast():
                logits = model(x.contiguous(memory_format=fmt))
            loss_sum += nn.functional.cross_entropy(logits.float(), y, reduction="sum")
            predicted = logits.argmax(1)
            correct += (predicted == y).sum()
            confusion.add(logits, y, predicted)
            self.progress()
        n = len(labels)
        return loss_sum.item() / n, correct.item() / n, confusion.result(self.data.classes)

    def checkpoint(self, epoch: int, step: int, within: dict[str, Any] | None = None) -> bytes:
        """Everything a resume needs; the data order is derived from (seed, epoch). At the
        end of `epoch`, or inside it with `within` (an EpochProgress state)."""
        state = {
            "epoch": epoch,
            "step": step,
            "spec": self.spec.model_dump(mode="json"),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "cpu_rng": torch.get_rng_state(),
            "normalization": self.data.normalization.as_dict(),
        }
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        if self.dev.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.dev)
        if within is not None:
            state["within_epoch"] = within
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    def _as_this_optimizer(self, saved: dict[str, Any]) -> dict[str, Any]:
        """A saved optimizer state with this run's implementation (fused on CUDA, foreach on
        the CPU), whichever device wrote it: load_state_dict would take the saved flags, and
        a foreach step handed the fp16 scaler's arguments of a fused one fails."""
        kinds = {k: self.optimizer.defaults.get(k) for k in ("foreach", "fused")}
        groups = [{**group, **kinds} for group in saved["param_groups"]]
        return {**saved, "param_groups": groups}

    def load_checkpoint(self, state: dict[str, Any]) -> tuple[int, int]:
        """Restore a checkpoint (read_saved of a Run.checkpoint; the run was built with its
        normalisation); returns (the epoch to train next, the last step done)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(self._as_this_optimizer(state["optimizer"]))
        self.scheduler.load_state_dict(state["scheduler"])
        if state["scaler"]:  # a disabled scaler (bf16, fp32, a CPU) saves nothing: start afresh
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None:
            if "ema" in state:
                self.ema.load_state_dict(state["ema"])
            else:  # the average of the checkpoint's weights, not of the random start
                self.ema.restart()
        torch.set_rng_state(state["cpu_rng"].cpu())
        if "cuda_rng" in state and self.dev.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"].cpu(), self.dev)
        epoch, step = int(state["epoch"]), int(state["step"])
        if "within_epoch" in state:
            self.resumed = EpochProgress.from_state(epoch, state["within_epoch"])
            return epoch, step
        return epoch + 1, step

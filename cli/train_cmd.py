"""`trainq train`: a local training run with a progress bar, no service needed."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tqdm import tqdm

from cli.options import spec_from_args
from core.config import Settings
from core.errors import TrainqError
from core.train import Callbacks, EpochMetrics, StepMetrics, train
from core.train.loop import RunInfo


class _Progress:
    """A tqdm bar over steps; per-batch loss and images/s in its postfix."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def start(self, info: RunInfo) -> None:
        self.bar = tqdm(
            total=info.total_steps,
            initial=info.start_step,
            unit="step",
            file=sys.stderr,
            desc=f"train on {info.device}, amp {info.amp}",
            dynamic_ncols=True,
        )

    def steps(self, points: Sequence[StepMetrics]) -> None:
        if self.bar is not None:
            last = points[-1]
            self.bar.set_postfix(
                epoch=last.epoch, loss=f"{last.loss:.4f}", img_s=f"{last.images_per_second:,.0f}"
            )
            self.bar.update(len(points))

    def epoch(self, m: EpochMetrics) -> None:
        msg = (
            f"epoch {m.epoch}: train loss {m.train_loss:.4f} acc {m.train_accuracy:.4f} | "
            f"test loss {m.test_loss:.4f} acc {m.test_accuracy:.4f} | "
            f"{m.images_per_second:,.0f} img/s, {m.duration_s:.1f}s"
        )
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train_command(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    settings = Settings()
    progress = _Progress()
    callbacks = Callbacks(on_start=progress.start, on_steps=progress.steps, on_epoch=progress.epoch)
    try:
        result = train(
            spec,
            data_dir=settings.data_dir,
            device=args.device,
            callbacks=callbacks,
            download=args.download,
        )
    except TrainqError as e:
        progress.close()
        print(f"trainq: {e.code}: {e.message}", file=sys.stderr)
        return 1
    progress.close()
    first = next(iter(result.models.values()))
    base = args.output or settings.data_dir / "models" / f"{first.sha256[:12]}.pt"
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = {}
    for fmt, model in result.models.items():
        paths[fmt] = base.with_suffix(fmt.suffix)
        paths[fmt].write_bytes(model.data)
        print(f"model ({fmt}): {paths[fmt]} (sha256 {model.sha256})", file=sys.stderr)
    record_path = base.with_suffix(".json")
    record_path.write_text(json.dumps(result.record, indent=2))
    print(f"run record: {record_path}", file=sys.stderr)
    if args.json:
        summary = {
            **result.summary(),
            "model_path": str(paths[first.format]),
            "model_paths": {fmt: str(path) for fmt, path in paths.items()},
            "record_path": str(record_path),
        }
        print(json.dumps(summary))
    return 0

"""The run record: the article's train_config.json, extended so a run can be reproduced."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch
import torchvision

from core.spec import JobSpec
from core.torchvision_weights import TORCHVISION_WEIGHTS
from core.train.data import Dataset
from core.train.device import amp_name, device_name
from core.train.model_card import preprocessing
from core.train.pretrained import WEIGHTS_FILE, WEIGHTS_PACKAGE, WEIGHTS_SHA256


def run_record(
    spec: JobSpec,
    dev: torch.device,
    data: Dataset,
    result: dict[str, Any],
    amp_dtype: torch.dtype | None,
) -> dict[str, Any]:
    return {
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        "spec": spec.model_dump(mode="json"),
        "amp_resolved": amp_name(amp_dtype),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version()
            if torch.backends.cudnn.is_available()
            else None,
        },
        "device": {"type": dev.type, "name": device_name(dev)},
        "host": platform.node(),
        "git_revision": _git_revision(),
        "dataset": {
            "name": data.name,
            "sha256": data.sha256,
            "train_size": len(data.train.labels),
            "test_size": len(data.test.labels),
            "image_shape": list(data.image_shape),
            "mean": data.mean,
            "std": data.std,
            "classes": list(data.classes),
        },
        "preprocessing": preprocessing(data),
        "model_input": "float32 (N, C, H, W) in [0, 1]; normalisation is inside the model",
        "pretrained_weights": _pretrained(spec),
        "result": result,
    }


def _pretrained(spec: JobSpec) -> dict[str, str] | None:
    """The file the run's starting weights came from, by its pinned sha256 (torchvision's: the
    prefix in its name, which it was verified by); None without."""
    if not spec.pretrained:
        return None
    tv = TORCHVISION_WEIGHTS.get(spec.model)
    if tv is None:
        return {"package": WEIGHTS_PACKAGE, "file": WEIGHTS_FILE, "sha256": WEIGHTS_SHA256}
    return {
        "torchvision": tv.weights, "file": tv.file_name, "url": tv.url,
        "sha256_prefix": tv.sha256_prefix,
    }  # fmt: skip


def _git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None

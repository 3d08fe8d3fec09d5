"""What every exported model says about itself, in its own metadata: the class names and the
preprocessing it takes, so that a model file used alone is self-describing. Two entries,
each a JSON text: `classes` (a name per output, in order) and `preprocessing`. They travel
as TorchScript `_extra_files`, torch.export `extra_files` and ONNX `metadata_props`.
See docs/api.md ("Model formats")."""

from __future__ import annotations

import json
from typing import Any

from core.spec import user_dataset_id
from core.train.data import Dataset

DEFAULT_FIT = "stretch"  # how a set without its own fit was resized: to H x W, as it came


def preprocessing(data: Dataset) -> dict[str, Any]:
    """What an image must be made into before the model takes it."""
    c, h, w = data.image_shape
    return {
        "input": "float32 images in [0, 1], laid out N,C,H,W",
        "layout": "NCHW",
        "range": [0.0, 1.0],
        "channels": c,
        "height": h,
        "width": w,
        "fit": _fit(data),
        "normalization": "folded into the model: do not subtract a mean or divide by a std",
        "mean": list(data.mean),  # per channel
        "std": list(data.std),
    }


def _fit(data: Dataset) -> str | None:
    """How the set's images were sized: the set's own fit where the trainer is told it; a
    built-in set's images are taken as they come ("stretch" to their own H x W). An uploaded
    set's fit is kept with the set in the database, which the trainer does not read: null
    until the set's file carries it, rather than a guess."""
    fit = getattr(data, "fit", None)
    if isinstance(fit, str):
        return fit
    return None if user_dataset_id(data.name) is not None else DEFAULT_FIT


def model_metadata(data: Dataset) -> dict[str, str]:
    """The metadata entries every format carries (core.train.verify_export.METADATA_KEYS)."""
    return {
        "classes": json.dumps(list(data.classes)),
        "preprocessing": json.dumps(preprocessing(data)),
    }

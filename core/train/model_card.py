"""What every exported model says about itself, in its own metadata: the class names and the
preprocessing it takes, so that a model file used alone is self-describing. Two entries,
each a JSON text: `classes` (a name per output, in order) and `preprocessing`. They travel
as TorchScript `_extra_files`, torch.export `extra_files` and ONNX `metadata_props`.
See docs/api.md ("Model formats")."""

from __future__ import annotations

import json
from typing import Any

from core.train.data import Dataset

DEFAULT_FIT = "stretch"  # how a set without its own fit was resized: to H x W, as it came


def preprocessing(data: Dataset) -> dict[str, Any]:
    """What an image must be made into before the model takes it, and what the model does to
    it itself: its normalisation (Dataset.normalization, the one the run trained with)."""
    c, h, w = data.image_shape
    norm = data.normalization
    return {
        "input": "float32 images in [0, 1], laid out N,C,H,W",
        "layout": "NCHW",
        "range": [0.0, 1.0],
        "channels": c,
        "height": h,
        "width": w,
        # An upload's set names the fit it was resized by; the built-in sets have none.
        "fit": data.fit or DEFAULT_FIT,
        "normalization": "folded into the model: do not subtract a mean or divide by a std",
        "mean": list(norm.mean),
        "std": list(norm.std),
        "normalized_by": norm.by,  # "data set", or "pretrained weights" (core.train.normalization)
    }


def model_metadata(data: Dataset) -> dict[str, str]:
    """The metadata entries every format carries (core.train.verify_export.METADATA_KEYS)."""
    return {
        "classes": json.dumps(list(data.classes)),
        "preprocessing": json.dumps(preprocessing(data)),
    }

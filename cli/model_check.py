"""`trainq download --check`: the downloaded model loaded and run on one blank image, in
this process. The file and the run record that says its input's shape both come from the
server, so the shape is one of a data set's or nothing runs: a record that named a huge one
would otherwise have this process allocate whatever it asked for."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from cli.problems import shown
from core.spec import ExportFormat

# A data set's images (core.datasets holds the same bounds for uploads, the built-in sets
# are 1×28×28): one or three channels, each side 4 to 256 pixels.
CHANNELS = (1, 3)
MIN_SIDE, MAX_SIDE = 4, 256


class UnlikelyShape(ValueError):
    """The run record's image shape is none a trainq data set has."""


def image_shape(record: Any) -> tuple[int, int, int]:
    """The (C, H, W) of the images the job trained on, as its run record names it, if it is
    a shape a data set can have; UnlikelyShape otherwise."""
    dataset = record.get("dataset") if isinstance(record, dict) else None
    shape = dataset.get("image_shape") if isinstance(dataset, dict) else None
    if not (isinstance(shape, list) and len(shape) == 3 and all(type(n) is int for n in shape)):
        raise UnlikelyShape(f"the run record's image shape {shape!r} is not [C, H, W]")
    c, h, w = shape
    if c not in CHANNELS or not (MIN_SIDE <= h <= MAX_SIDE and MIN_SIDE <= w <= MAX_SIDE):
        raise UnlikelyShape(
            f"the run record's image shape {shape} is no data set's (C 1 or 3, H and W "
            f"{MIN_SIDE} to {MAX_SIDE})"
        )
    return c, h, w


def check_model(fmt: ExportFormat, path: Path, record: Any) -> int:
    """Run the model at `path` once on a blank image of the record's shape; the exit code."""
    try:
        shape = image_shape(record)
    except UnlikelyShape as e:
        print(f"trainq: --check: {e}: the model was not run", file=sys.stderr)
        return 1
    try:
        import torch

        from core.train.verify_export import load_model

        model = load_model(fmt, path.read_bytes())
    except ImportError as e:
        print(
            f"trainq: --check loads the model, which needs {e.name}, which this install "
            "lacks: pip install 'trainq[worker]' (the file is downloaded and its sha256 "
            "checked)",
            file=sys.stderr,
        )
        return 1
    except Exception as e:  # a file the server sent: whatever it holds is the server's doing
        return _failed("did not load", e)
    try:
        with torch.inference_mode():
            out = tuple(model(torch.zeros(1, *shape)).shape)
    except Exception as e:  # its forward is the server's code: a failure, an allocation...
        return _failed("loads, but failed on a blank image", e)
    print(
        f"{path} loads: {'×'.join(map(str, shape))} images in, logits shape {out}",
        file=sys.stderr,
    )
    return 0


def _failed(what: str, e: Exception) -> int:
    """One line: what went wrong, the exception's first line escaped (it quotes the file)."""
    why = shown(str(e).strip().partition("\n")[0][:300])
    print(f"trainq: --check: the model {what}: {type(e).__name__}: {why}", file=sys.stderr)
    return 1

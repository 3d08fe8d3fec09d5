"""Whether one job's trained weights fit another spec's model, by arithmetic alone (no model
is built): the API refuses an `init_from` that its worker's load
(core.train.archs.start_from) would refuse, saying which field differs and what would fit.
The class layer may differ: it is made anew. See docs/models.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.model_sizes import ARCHS, SMALL_INPUT, cnn_features

if TYPE_CHECKING:
    from core.spec import JobSpec

Shape = tuple[int, int, int]  # (C, H, W)
CNN_WIDTHS = ("conv1_channels", "conv2_channels", "conv3_channels", "hidden")


def start_problem(
    job_id: str, source: JobSpec, source_shape: Shape | None, spec: JobSpec, shape: Shape | None
) -> str | None:
    """Why the weights job `job_id` trained (`source`, on images of `source_shape`) do not
    load into `spec`'s model for images of `shape`, or None. A shape not known (None) is not
    judged: the worker's load still is."""
    if source.model != spec.model:
        return f"job {job_id} trained a {source.model}: set model '{source.model}'"
    widths = [f for f in CNN_WIDTHS if getattr(source, f) != getattr(spec, f)]
    if widths:  # the cnn's (another model's are their defaults)
        fit = ", ".join(f"{f} {getattr(source, f)}" for f in widths)
        this = ", ".join(f"{f} {getattr(spec, f)}" for f in widths)
        return f"job {job_id} trained a cnn of {fit}, not {this}: set {fit}"
    if source_shape is None or shape is None:
        return None
    if source_shape[0] != shape[0]:
        return (
            f"job {job_id} trained on {_channels(source_shape)} images ({_shape(source_shape)}), "
            f"and {spec.dataset} holds {_channels(shape)} ones ({_shape(shape)}): use a data "
            f"set of {_channels(source_shape)} images"
        )
    return _size_problem(job_id, source_shape, spec, shape)


def _size_problem(job_id: str, source_shape: Shape, spec: JobSpec, shape: Shape) -> str | None:
    """Image sides that change a weight's shape: the cnn's fc1 (its inputs are the last
    block's pooled maps) and the ResNets' stem (7×7 above SMALL_INPUT, 3×3 at or below)."""
    theirs, yours = _shape(source_shape), _shape(shape)
    if spec.model == "cnn":
        features, mine = cnn_features(spec, source_shape), cnn_features(spec, shape)
        if features == mine:
            return None
        return (
            f"job {job_id}'s fc1 takes {features:,} features, from its {theirs} images; "
            f"{spec.dataset}'s {yours} images make {mine:,}: use a data set of {theirs} images"
        )
    kernels = ARCHS[spec.model].stem_kernel
    if kernels[_standard(source_shape)] == kernels[_standard(shape)]:
        return None
    side = f"over {SMALL_INPUT} px" if _standard(source_shape) else f"{SMALL_INPUT} px or less"
    return (
        f"job {job_id} trained its {spec.model} on {theirs} images, whose stem is another "
        f"shape than that of {spec.dataset}'s {yours} ones: use a data set of images {side} "
        "a side"
    )


def _standard(shape: Shape) -> int:
    """1 where the standard stem serves images of `shape`, 0 where the small-input one does."""
    return int(max(shape[1:]) > SMALL_INPUT)


def _channels(shape: Shape) -> str:
    return f"{shape[0]}-channel"


def _shape(shape: Shape) -> str:
    return "×".join(map(str, shape))

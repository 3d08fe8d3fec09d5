"""What a spec's model costs, by arithmetic alone (no model is built): its parameters and,
the memory one training step needs, so the API refuses a
job that no worker could hold. See docs/models.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.spec import JobSpec

# A checkpoint holds ~16 bytes a parameter (weights, AdamW's two moments, the moving
# average): 30M parameters make ~480 MB, within a database blob (SQLite ~1 GB, PostgreSQL
# 1 GB) with room to spare, and far past what these data sets need.
MAX_PARAMETERS = 30_000_000
# What one training step may hold, activations and the checkpointed state together: a 24 GB
# GPU with room for the allocator's slack, the resident data set and the export.
WORKER_MEMORY_BYTES = 16 * 2**30
SMALL_INPUT = 64  # at this side or less, the stems keep full resolution (CIFAR practice)
MIN_SIDE, MAX_SIDE = 8, 512  # torchvision's architectures: images they are offered for


@dataclass(frozen=True)
class Arch:
    """A torchvision architecture's size: parameters without its stem and class layer (`body`),
    the stem's outputs and kernel side, the class layer's inputs; and the bytes autograd keeps
    per input pixel per image in an fp32 training step, with a small-input stem and with the
    standard one (measured with saved_tensors_hooks at 8 and 65 px, the worst per pixel)."""

    body: int
    stem_out: int
    stem_kernel: tuple[int, int]  # (small stem, standard stem)
    head_in: int
    saved_per_pixel: tuple[int, int]  # (small stem, standard stem)


ARCHS = {
    "resnet18": Arch(11_167_104, 64, (3, 7), 512, (5220, 528)),
    "resnet34": Arch(21_275_264, 64, (3, 7), 512, (8884, 798)),
    "mobilenet_v3_small": Arch(1_517_424, 16, (3, 3), 1024, (3215, 469)),
    "mobilenet_v3_large": Arch(4_201_600, 16, (3, 3), 1280, (7016, 1185)),
    "efficientnet_b0": Arch(4_006_684, 32, (3, 3), 1280, (12802, 2296)),
    # TensorFlow's SAME padding pads a side smaller than a kernel up to it: worst at 9 px.
    "efficientnet_lite0": Arch(3_370_144, 32, (3, 3), 1280, (14100, 2040)),
}


def parameter_count(spec: JobSpec, image_shape: tuple[int, int, int], num_classes: int) -> int:
    """The parameters of the spec's model (core.train.archs.build_model) on images of
    `image_shape` (C, H, W)."""
    c, h, w = image_shape
    arch = ARCHS.get(spec.model)
    if arch is not None:  # pretrained weights keep the standard stem's kernels on small images
        k = arch.stem_kernel[0 if max(h, w) <= SMALL_INPUT and not spec.pretrained else 1]
        return arch.body + arch.stem_out * k * k * c + (arch.head_in + 1) * num_classes
    c1, c2, c3 = spec.conv1_channels, spec.conv2_channels, spec.conv3_channels
    n = c * c1 * 9 + 2 * c1 + c1 * c2 * 9 + 2 * c2  # convs (no bias) and their BatchNorms
    if c3:
        n += c2 * c3 * 9 + 2 * c3
    fc1 = cnn_features(spec, image_shape) * spec.hidden + spec.hidden
    return n + fc1 + spec.hidden * num_classes + num_classes


def cnn_features(spec: JobSpec, image_shape: tuple[int, int, int]) -> int:
    """The inputs of the cnn's fc1 (core.train.model.Net): the last block's channels times
    its map, pooled twice, and once more by a third block unless that would leave under 1 px."""
    _, h, w = image_shape
    h, w = h // 4, w // 4
    if spec.conv3_channels and min(h, w) >= 2:
        h, w = h // 2, w // 2
    return (spec.conv3_channels or spec.conv2_channels) * h * w


def _saved_per_image(spec: JobSpec, image_shape: tuple[int, int, int]) -> int:
    """Bytes autograd keeps per image in an fp32 step: for a torchvision architecture as
    measured (ARCHS); for the cnn, each block keeps its conv's input, its BatchNorm's and
    max-pool's inputs (4 bytes a value each), the pool's int64 indices and the ReLU's output
    at a quarter of the pixels: 11 bytes a pixel a channel (measured with
    saved_tensors_hooks within 15%)."""
    c, h, w = image_shape
    arch = ARCHS.get(spec.model)
    if arch is not None:
        return arch.saved_per_pixel[0 if max(h, w) <= SMALL_INPUT else 1] * h * w
    pixels = h * w
    saved = pixels * (4 * c + 11 * spec.conv1_channels) + pixels // 4 * 11 * spec.conv2_channels
    last = spec.conv2_channels * (pixels // 16)
    if spec.conv3_channels:
        saved += pixels // 16 * 11 * spec.conv3_channels
        last = spec.conv3_channels * (pixels // 64 or pixels // 16)
    return saved + 4 * (last + 2 * spec.hidden)


def step_memory(spec: JobSpec, image_shape: tuple[int, int, int], num_classes: int) -> int:
    """Bytes of one training step: what autograd keeps, twice (the backward's gradients of
    it are as large), and 16 bytes a parameter. fp32: mixed precision only lowers it."""
    saved = _saved_per_image(spec, image_shape) * spec.batch_size
    return 2 * saved + 16 * parameter_count(spec, image_shape, num_classes)


def model_too_large(
    spec: JobSpec, image_shape: tuple[int, int, int], num_classes: int
) -> str | None:
    """Why the spec's model does not fit these images (its parameters, their size, the memory
    of a step), or None."""
    shape = "×".join(map(str, image_shape))
    n = parameter_count(spec, image_shape, num_classes)
    if spec.model not in ARCHS and n > MAX_PARAMETERS:
        return (
            f"the model would have {n:,} parameters on {shape} images "
            f"(conv1_channels {spec.conv1_channels}, conv2_channels {spec.conv2_channels}, "
            f"conv3_channels {spec.conv3_channels}, hidden {spec.hidden}): at most "
            f"{MAX_PARAMETERS:,}. Narrow the layers."
        )
    _, h, w = image_shape
    if spec.model in ARCHS and (min(h, w) < MIN_SIDE or max(h, w) > MAX_SIDE):
        return (
            f"{spec.model} takes images of {MIN_SIDE} to {MAX_SIDE} px a side, not {shape}: "
            'use model "cnn", or a data set of another image_size'
        )
    need = step_memory(spec, image_shape, num_classes)
    if need <= WORKER_MEMORY_BYTES:
        return None
    per_image = step_memory(spec.model_copy(update={"batch_size": 1}), image_shape, num_classes)
    fits = max(0, (WORKER_MEMORY_BYTES - 16 * n) // (per_image - 16 * n))
    return (
        f"{spec.model} at batch_size {spec.batch_size} on {shape} images needs about "
        f"{need / 2**30:.1f} GiB a step, more than a worker holds "
        f"({WORKER_MEMORY_BYTES / 2**30:.0f} GiB): use batch_size {fits} or less, "
        "smaller images, or a smaller model"
    )

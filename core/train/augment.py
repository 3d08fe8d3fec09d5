"""Augmentation on the device: each training batch moved by a small random affine map (a
rotation, a scale and a shift per image), as one batched grid sample where the batch already
is. No DataLoader, no per-image Python, and the same draws for the same (seed, epoch), so a
resumed run sees the batches it would have seen.

Edges repeat the border pixel (padding_mode="border"): the background of digits and clothes
is black, and for a set whose background is not, no black frame appears either. No flips
for `affine` and `shift`: a flipped digit is another symbol (or none). `photo` (asked for
by name, never a default) adds them: a random resized crop, a horizontal flip and a light
colour jitter, for photos. See docs/models.md."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.spec import Augment


@dataclass(frozen=True)
class Affine:
    degrees: float  # rotation, uniform in ±degrees
    scale: float  # zoom, uniform in 1 ± scale
    shift: float  # translation, uniform in ±shift of the side (0.08 of 28 px: ±2.2 px)


AFFINE = {
    Augment.affine: Affine(degrees=10.0, scale=0.1, shift=0.08),
    Augment.shift: Affine(degrees=0.0, scale=0.0, shift=0.08),
}


# A batch (B, C, H, W) of normalised floats, and the epoch's own generator on its device.
Augmenter = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def augmenter(kind: Augment) -> Augmenter | None:
    if kind is Augment.photo:
        return random_photo
    a = AFFINE.get(kind)
    return None if a is None else functools.partial(_affine_of, a)


def _affine_of(a: Affine, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return random_affine(x, a, g)


def random_affine(x: torch.Tensor, a: Affine, g: torch.Generator) -> torch.Tensor:
    """x: (B, C, H, W) float, on g's device. Each image gets its own map."""
    b = x.shape[0]
    r = torch.rand(b, 4, generator=g, device=x.device).mul_(2).sub_(1)  # (B, 4) in [-1, 1)
    angle = r[:, 0] * math.radians(a.degrees)
    inv_scale = 1.0 / (1.0 + r[:, 1] * a.scale)  # the grid maps output to input: invert
    cos, sin = angle.cos() * inv_scale, angle.sin() * inv_scale
    # affine_grid works in [-1, 1]: a shift of s of the side is 2 s.
    tx, ty = r[:, 2] * (2 * a.shift), r[:, 3] * (2 * a.shift)
    h, w = x.shape[-2:]
    gx, gy = _base_grid(h, w, x.device)  # (1, H, W) each
    # Where each output pixel reads from: [[cos, -sin, tx], [sin, cos, ty]] applied to its
    # centre, as broadcast products (F.affine_grid's batched matmul is ~20x slower on a CPU).
    cos, sin, tx, ty = (t.view(b, 1, 1) for t in (cos, sin, tx, ty))
    grid = torch.stack([cos * gx - sin * gy + tx, sin * gx + cos * gy + ty], -1)  # (B, H, W, 2)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


CROP_AREA = (0.35, 1.0)  # the part of the image a crop keeps, as torchvision's RRC (0.08) is
# for 224 px ImageNet photos: on 32 px images a crop under a third keeps too little.
CROP_RATIO = (3 / 4, 4 / 3)
JITTER = 0.2  # brightness, contrast and saturation, each uniform in 1 ± JITTER


def random_photo(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """x: (B, C, H, W) normalised floats. Per image: a random resized crop (area, aspect)
    scaled back to the full size, a horizontal flip half the time, and a light colour jitter,
    all in one grid sample and three blends."""
    return photo_with(x, torch.rand(x.shape[0], 8, generator=g, device=x.device))


def photo_with(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """random_photo with its draws given: r (B, 8) in [0, 1), an image's row read as crop
    area, aspect, flip (under 0.5), crop centre x and y, brightness, contrast, saturation."""
    b = x.shape[0]
    area = CROP_AREA[0] + r[:, 0] * (CROP_AREA[1] - CROP_AREA[0])
    lo, hi = math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])
    ratio = torch.exp(lo + r[:, 1] * (hi - lo))
    cw, ch = (area * ratio).sqrt().clamp(max=1), (area / ratio).sqrt().clamp(max=1)
    flip = torch.where(r[:, 2] < 0.5, -1.0, 1.0)
    tx, ty = (r[:, 3] * 2 - 1) * (1 - cw), (r[:, 4] * 2 - 1) * (1 - ch)  # the crop stays inside
    gx, gy = _base_grid(*x.shape[-2:], x.device)  # (1, H, W) each
    sx, cw, ch, tx, ty = (t.view(b, 1, 1) for t in (flip * cw, cw, ch, tx, ty))
    grid = torch.stack([sx * gx + tx, ch * gy + ty], -1)  # (B, H, W, 2)
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return _jitter(x, r[:, 5:].mul(2).sub(1).mul(JITTER).add(1))


def _jitter(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """f: (B, 3) factors near 1 for brightness, contrast, saturation. On normalised images:
    brightness scales each image about zero (the set's mean), contrast about the image's own
    mean, saturation about each pixel's grey (the mean of its channels; a no-op on grey)."""
    b = x.shape[0]
    bright, contrast, sat = (f[:, i].view(b, 1, 1, 1) for i in range(3))
    x = x * bright
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    x = mean + (x - mean) * contrast
    grey = x.mean(dim=1, keepdim=True)
    return grey + (x - grey) * sat


@functools.lru_cache(maxsize=8)  # the same grid every batch: built once per size and device
def _base_grid(h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each output pixel's centre in [-1, 1], as F.affine_grid places it: x then y, (1, H, W)."""
    ys = (torch.arange(h, device=device) * 2 + 1) / h - 1
    xs = (torch.arange(w, device=device) * 2 + 1) / w - 1
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return gx.unsqueeze(0), gy.unsqueeze(0)

"""Augmentation on the device: each training batch moved by a small random affine map (a
rotation, a scale and a shift per image), as one batched grid sample where the batch already
is. No DataLoader, no per-image Python, and the same draws for the same (seed, epoch), so a
resumed run sees the batches it would have seen.

Edges repeat the border pixel (padding_mode="border"): the background of digits and clothes
is black, and for a set whose background is not, no black frame appears either. No flips:
a flipped digit is another symbol (or none)."""

from __future__ import annotations

import functools
import math
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


def augmenter(kind: Augment) -> Affine | None:
    return AFFINE.get(kind)


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


@functools.lru_cache(maxsize=8)  # the same grid every batch: built once per size and device
def _base_grid(h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each output pixel's centre in [-1, 1], as F.affine_grid places it: x then y, (1, H, W)."""
    ys = (torch.arange(h, device=device) * 2 + 1) / h - 1
    xs = (torch.arange(w, device=device) * 2 + 1) / w - 1
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return gx.unsqueeze(0), gy.unsqueeze(0)

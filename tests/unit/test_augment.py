"""On-device augmentation: the batched affine map is the one torch's affine_grid describes,
each image moves on its own, and the moves depend only on (seed, epoch)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from core.spec import Augment, JobSpec
from core.train.augment import AFFINE, Affine, augmenter, photo_with, random_affine, random_photo
from core.train.data import ResidentBatches, load_dataset
from tests.photos import photo_patches


def reference(x: torch.Tensor, a: Affine, seed: int) -> torch.Tensor:
    """The same draws, mapped with F.affine_grid (the slow path the module replaces)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.rand(x.shape[0], 4, generator=g).mul_(2).sub_(1)
    angle = r[:, 0] * math.radians(a.degrees)
    inv = 1 / (1 + r[:, 1] * a.scale)
    cos, sin = angle.cos() * inv, angle.sin() * inv
    tx, ty = r[:, 2] * 2 * a.shift, r[:, 3] * 2 * a.shift
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, padding_mode="border", align_corners=False)


def test_the_map_is_affine_grids() -> None:
    x = torch.rand(16, 1, 28, 20) * 255
    a = AFFINE[Augment.affine]
    got = random_affine(x, a, torch.Generator().manual_seed(5))
    torch.testing.assert_close(got, reference(x, a, 5), atol=1e-3, rtol=0)


def test_each_image_moves_on_its_own_and_stays_in_range() -> None:
    x = torch.zeros(8, 1, 28, 28)
    x[:, :, 10:18, 10:18] = 255.0  # the same square in every image
    out = random_affine(x, AFFINE[Augment.affine], torch.Generator().manual_seed(0))
    assert len({tuple(img.flatten().tolist()) for img in out.round()}) == 8
    # Bilinear with repeated borders: no overshoot, and the square never leaves the image.
    assert out.min() >= 0 and out.max() <= 255 + 1e-3
    assert all(img.sum() > 0 for img in out)


def test_none_means_the_images_as_they_are() -> None:
    assert augmenter(Augment.none) is None
    x, shift = torch.rand(4, 1, 8, 8), augmenter(Augment.shift)
    assert shift is not None
    moved = random_affine(
        x, Affine(degrees=0.0, scale=0.0, shift=0.08), torch.Generator().manual_seed(1)
    )
    assert torch.equal(shift(x, torch.Generator().manual_seed(1)), moved)


def test_augmented_batches_depend_only_on_seed_and_epoch(data_dir: Path) -> None:
    data = load_dataset("mnist-sample", data_dir)

    def batches(seed: int, epoch: int, kind: Augment) -> list[torch.Tensor]:
        b = ResidentBatches(
            data.train,
            torch.device("cpu"),
            batch_size=512,
            mean=data.mean,
            std=data.std,
            channels_last=False,
            seed=seed,
            augment=augmenter(kind),
        )
        torch.manual_seed(123)  # anything else drawing numbers does not change the moves
        first = [x for x, _ in b.epoch(epoch)][:3]
        torch.rand(1000)
        return first

    a, b = batches(1, 2, Augment.affine), batches(1, 2, Augment.affine)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], batches(1, 3, Augment.affine)[0])
    plain = batches(1, 2, Augment.none)
    assert not torch.equal(a[0], plain[0])  # the same images, moved


def test_the_default_spec_augments_and_averages() -> None:
    spec = JobSpec()
    assert spec.augment is Augment.affine
    assert spec.ema_decay is not None


def test_photo_crops_flips_and_jitters_each_image_from_its_seed() -> None:
    x = torch.from_numpy(photo_patches(16, 4)[0]).float().div(255).sub(0.5)  # real photos
    a = random_photo(x, torch.Generator().manual_seed(3))
    b = random_photo(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == x.shape
    assert not torch.equal(a, random_photo(x, torch.Generator().manual_seed(4)))
    assert len({tuple(img.flatten().tolist()) for img in a}) == len(x)
    assert torch.isfinite(a).all()


def test_photo_is_never_the_default_and_a_flip_mirrors() -> None:
    assert JobSpec().augment is not Augment.photo
    # The crop spans the whole image (area 1, aspect 1) and no jitter: a flip mirrors exactly.
    x = torch.arange(64, dtype=torch.float32).view(1, 1, 8, 8)
    draws = torch.tensor([[1.0, 0.5, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5]])
    assert torch.allclose(photo_with(x, draws), x.flip(-1), atol=1e-4)
    draws[0, 2] = 0.5  # no flip
    assert torch.allclose(photo_with(x, draws), x, atol=1e-4)

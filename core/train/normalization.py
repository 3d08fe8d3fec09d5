"""What a run's model takes its input normalised by, chosen once per run: every path that
feeds or describes the model reads it from the run's Dataset (`Dataset.normalization`): the
training batches, evaluation, every exported format (folded into the model, so predict
applies it too), the formats' metadata and the run record. See docs/models.md
("The input's normalisation")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.errors import InvalidSpec
from core.spec import Architecture, JobSpec
from core.torchvision_weights import TORCHVISION_WEIGHTS
from core.train.pretrained import MEAN, STD
from core.train.torchvision_pretrained import IMAGENET_MEAN, IMAGENET_STD

# Where a run's normalisation came from: its own set, the pretrained weights' preprocessing.
DATA_SET = "data set"
PRETRAINED = "pretrained weights"

# Per architecture, the mean and std its pretrained weights were trained with: Lite0's own,
# ImageNet's for torchvision's (every Weights enum of theirs has these transforms).
PRETRAINED_STATS = {
    Architecture.efficientnet_lite0: (MEAN, STD),
    **{arch: (IMAGENET_MEAN, IMAGENET_STD) for arch in TORCHVISION_WEIGHTS},
}

# The entry of a job's weights (Run.weights), beside the net's own tensors, that holds the
# normalisation they were trained on: a job started from them (init_from) keeps it.
WEIGHTS_KEY = "input_normalization"


@dataclass(frozen=True)
class Normalization:
    """x' = (x − mean) / std per channel, x in [0, 1]; `by` says where it came from."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    by: str = DATA_SET

    def as_dict(self) -> dict[str, Any]:
        """As a checkpoint and a job's weights hold it (torch.load's weights_only reads it)."""
        return {"mean": list(self.mean), "std": list(self.std), "by": self.by}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> Normalization:
        return cls(tuple(saved["mean"]), tuple(saved["std"]), str(saved["by"]))


def of_pretrained(arch: Architecture, channels: int) -> Normalization:
    """The pretrained weights' own: on one channel (a stem adapted to gray, which sees a gray
    image as the RGB net sees one whose channels are equal) the mean of the three."""
    mean, std = PRETRAINED_STATS[arch]
    if channels == 1:
        return Normalization((sum(mean) / 3,), (sum(std) / 3,), PRETRAINED)
    return Normalization(tuple(mean), tuple(std), PRETRAINED)


def split_weights(weights: dict[str, Any]) -> tuple[dict[str, torch.Tensor], Normalization | None]:
    """A job's weights as the net's tensors and the normalisation they were trained on (None
    in weights stored before they carried one)."""
    net = {k: v for k, v in weights.items() if k != WEIGHTS_KEY}
    saved = weights.get(WEIGHTS_KEY)
    return net, None if saved is None else Normalization.from_dict(saved)


def choose(
    spec: JobSpec, own: Normalization, channels: int, kept: Normalization | None
) -> Normalization:
    """The run's: `kept` where its weights come with one (a checkpoint's, or the weights of
    the job init_from names: fine-tuning keeps the input its weights were trained on), the
    pretrained weights' with `pretrained`, else the set's `own`. InvalidSpec on init_from
    when the kept one is for another number of channels."""
    if kept is not None:
        if len(kept.mean) != channels:
            raise InvalidSpec(
                "init_from",
                f"job {spec.init_from}'s weights take {len(kept.mean)} channels, these images "
                f"have {channels}",
            )
        return kept
    if spec.pretrained:
        return of_pretrained(spec.model, channels)
    return own


def kept(
    own: Normalization, checkpoint: dict[str, Any] | None, weights: dict[str, Any] | None
) -> Normalization | None:
    """The normalisation a run's start was trained on: its checkpoint's (one written before
    checkpoints held it was normalised by its set: `own`), else that of the weights of the
    job init_from names (None in weights stored before they held one), else None."""
    if checkpoint is not None:
        saved = checkpoint.get("normalization")
        return own if saved is None else Normalization.from_dict(saved)
    return None if weights is None else split_weights(weights)[1]

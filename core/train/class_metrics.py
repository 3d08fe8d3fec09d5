"""Per-class figures of an evaluation: the confusion matrix, each class's accuracy, and top-5
accuracy where there are more than ten classes. Counted on the device while the evaluation
runs (no extra pass, one copy to the host at its end). See docs/api.md ("Class metrics")."""

from __future__ import annotations

from typing import Any

import torch

TOP_K = 5
TOP_K_FROM = 11  # top-5 is reported for sets of more than ten classes


class ConfusionCounter:
    """Counts (true class, predicted class) pairs of an evaluation's batches on the device."""

    def __init__(self, num_classes: int, dev: torch.device) -> None:
        self.k = num_classes
        self.counts = torch.zeros(num_classes * num_classes, dtype=torch.long, device=dev)
        self.top_k = torch.zeros((), dtype=torch.long, device=dev)
        self.with_top_k = num_classes >= TOP_K_FROM

    def add(self, logits: torch.Tensor, labels: torch.Tensor, predicted: torch.Tensor) -> None:
        """One batch: its logits (B, K), true labels (B,) and argmax predictions (B,)."""
        self.counts += torch.bincount(labels * self.k + predicted, minlength=self.k * self.k)
        if self.with_top_k:
            best = logits.topk(TOP_K, dim=1).indices  # (B, 5)
            self.top_k += (best == labels[:, None]).any(dim=1).sum()

    def result(self, classes: tuple[str, ...]) -> dict[str, Any]:
        """JSON-ready: rows are the true classes, columns the predicted ones."""
        return class_metrics(
            self.counts.view(self.k, self.k).tolist(),
            classes,
            int(self.top_k.item()) if self.with_top_k else None,
        )


def class_metrics(
    confusion: list[list[int]], classes: tuple[str, ...], top_k_correct: int | None
) -> dict[str, Any]:
    """The stored form of one epoch's class figures (epoch_metrics.class_metrics)."""
    totals = [sum(row) for row in confusion]
    n = sum(totals)
    return {
        "classes": list(classes),
        "confusion": confusion,
        "per_class_accuracy": [
            row[i] / total if total else None
            for i, (row, total) in enumerate(zip(confusion, totals, strict=True))
        ],
        "top5_accuracy": None if top_k_correct is None or not n else top_k_correct / n,
    }

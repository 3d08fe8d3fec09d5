"""Per-class figures of an evaluation (core.train.class_metrics): counted on the device
during the evaluation, the confusion matrix's rows sum to the test split's class counts."""

from __future__ import annotations

from pathlib import Path

import torch

from core.train import TrainResult
from core.train.class_metrics import ConfusionCounter, class_metrics
from core.train.data import load_dataset
from tests.conftest import Recorder


def test_the_counter_puts_true_classes_in_rows_and_predictions_in_columns() -> None:
    counter = ConfusionCounter(3, torch.device("cpu"))
    labels = torch.tensor([0, 0, 1, 2, 2, 2])
    logits = torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 2, 0, 2]), 3).float()
    for half in (slice(0, 3), slice(3, 6)):  # two batches add up
        counter.add(logits[half], labels[half], logits[half].argmax(1))
    figures = counter.result(("a", "b", "c"))
    assert figures["classes"] == ["a", "b", "c"]
    assert figures["confusion"] == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert figures["per_class_accuracy"] == [0.5, 1.0, 2 / 3]
    assert figures["top5_accuracy"] is None  # ten classes or fewer: no top-5


def test_top5_is_counted_past_ten_classes() -> None:
    k = 12
    counter = ConfusionCounter(k, torch.device("cpu"))
    labels = torch.tensor([0, 1, 2, 3])
    logits = torch.zeros(4, k)
    logits[0, 0] = 9  # right
    logits[1, 2:6] = 9  # class 1 not in the top 5
    logits[1, 1] = 8  # ... it is sixth
    logits[1, 6] = 10
    logits[2, [5, 2]] = torch.tensor([9.0, 8.0])  # second: within the top 5
    logits[3, 4:9] = 9  # class 3 out of the top five
    counter.add(logits, labels, logits.argmax(1))
    figures = counter.result(tuple(str(i) for i in range(k)))
    assert figures["top5_accuracy"] == 0.5


def test_a_class_without_test_images_has_no_accuracy() -> None:
    figures = class_metrics([[2, 0], [0, 0]], ("x", "y"), None)
    assert figures["per_class_accuracy"] == [1.0, None]


def test_each_epoch_names_the_digits_and_counts_the_whole_test_split(
    two_epochs: tuple[TrainResult, Recorder], data_dir: Path
) -> None:
    _, rec = two_epochs
    test = load_dataset("mnist-sample", data_dir).test
    class_counts = torch.bincount(test.labels, minlength=10).tolist()
    assert [e.epoch for e in rec.epochs] == [1, 2]
    for epoch in rec.epochs:
        figures = epoch.class_metrics
        assert figures is not None
        assert figures["classes"] == [str(d) for d in range(10)]
        confusion = torch.tensor(figures["confusion"])
        assert confusion.shape == (10, 10)
        assert confusion.sum(1).tolist() == class_counts  # each row: that digit's test images
        assert confusion.trace().item() / len(test.labels) == epoch.test_accuracy
        for k, accuracy in enumerate(figures["per_class_accuracy"]):
            assert accuracy == confusion[k, k].item() / class_counts[k]
        assert figures["top5_accuracy"] is None


def test_the_run_record_names_the_classes_and_the_preprocessing(
    two_epochs: tuple[TrainResult, Recorder],
) -> None:
    result, _ = two_epochs
    assert result.record["dataset"]["classes"] == [str(d) for d in range(10)]
    pre = result.record["preprocessing"]
    assert (pre["channels"], pre["height"], pre["width"]) == (1, 28, 28)
    assert pre["layout"] == "NCHW" and pre["range"] == [0.0, 1.0] and pre["fit"] == "stretch"

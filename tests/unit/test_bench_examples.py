"""bench.vs_examples reads the reference's own accuracy lines, stops its clock at the first
epoch that reaches the target, and hands it the very files trainq reads, under ../data."""

from __future__ import annotations

from pathlib import Path

from bench.vs_examples import reference
from core.train.data import dataset_files

# Stands in for pytorch/examples' main.py: it checks the files are where torchvision's MNIST
# looks (../data/MNIST/raw) and prints the script's own lines, one epoch's test at a time.
SCRIPT = """
import sys
from pathlib import Path
raw = Path("../data/MNIST/raw")
assert sorted(p.name for p in raw.iterdir()) == [
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
assert all(p.resolve().stat().st_size > 0 for p in raw.iterdir())
assert "--no-accel" in sys.argv
for correct in (9500, 9890, 9903, 9950):
    print("Train Epoch: 1 [0/60000 (0%)]\\tLoss: 0.3")
    print(f"\\nTest set: Average loss: 0.0300, Accuracy: {correct}/10000 (99%)\\n")
"""


def test_the_reference_clock_stops_at_the_first_epoch_past_the_target(
    tmp_path: Path, data_dir: Path
) -> None:
    (tmp_path / "main.py").write_text(SCRIPT)
    files = dataset_files("mnist-sample", data_dir)
    got = reference(tmp_path, files, target=0.99, epochs=14)
    assert got["reached"] and got["epochs"] == 3 and got["test_accuracy"] == 0.9903
    never = reference(tmp_path, files, target=0.999, epochs=14)
    assert not never["reached"] and never["seconds"] is None and never["epochs"] == 4

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from core.train import TrainResult
from core.train.data import load_dataset
from core.train.export import load_torchscript
from tests.conftest import Recorder

FRESH_PROCESS = """
import sys, warnings, torch
warnings.simplefilter("ignore")
model = torch.jit.load(sys.argv[1], map_location="cpu").eval()
x = torch.load(sys.argv[2])
with torch.inference_mode():
    torch.save(model(x), sys.argv[3])
"""


def test_torchscript_reloads_in_a_fresh_process_with_the_same_logits(
    two_epochs: tuple[TrainResult, Recorder], data_dir: Path, tmp_path: Path
) -> None:
    result, _ = two_epochs
    model_file = tmp_path / "model.pt"
    model_file.write_bytes(result.model)
    test = load_dataset("mnist-sample", data_dir).test
    x = test.images.float().div(255)
    torch.save(x, tmp_path / "x.pt")
    subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, model_file, tmp_path / "x.pt", tmp_path / "y.pt"],
        check=True,
    )
    fresh = torch.load(tmp_path / "y.pt")
    with torch.inference_mode():
        here = load_torchscript(result.model)(x)
    assert torch.allclose(fresh, here, atol=1e-5)
    # It is the trained model: it classifies the held-out digits as the trainer measured.
    accuracy = (fresh.argmax(1) == test.labels).float().mean().item()
    assert abs(accuracy - result.test_accuracy) < 0.002

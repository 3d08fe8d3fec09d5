"""Every exported format carries the class names and the preprocessing in its own metadata
(core.train.model_card), read back in a fresh process with that format's own loader, and
the export's fresh-process check refuses a format without them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from core.spec import ExportFormat
from core.train import TrainResult
from core.train.data import load_dataset
from core.train.model_card import model_metadata
from core.train.verify_export import check_all, load_model
from tests.conftest import Recorder

DIGITS = [str(d) for d in range(10)]

# Each reads a model file alone, as a user would: no trainq, and for ONNX no torch either.
READERS = {
    ExportFormat.onnx: """
import json, sys
import onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
print(json.dumps(session.get_modelmeta().custom_metadata_map))
assert "torch" not in sys.modules
""",
    ExportFormat.torchscript: """
import json, sys, warnings, torch
warnings.simplefilter("ignore")
found = {"classes": "", "preprocessing": ""}
torch.jit.load(sys.argv[1], _extra_files=found)
print(json.dumps({k: v.decode() if isinstance(v, bytes) else v for k, v in found.items()}))
""",
    ExportFormat.pt2: """
import json, sys, torch
found = {"classes": "", "preprocessing": ""}
torch.export.load(sys.argv[1], extra_files=found)
print(json.dumps({k: v.decode() if isinstance(v, bytes) else v for k, v in found.items()}))
""",
}


@pytest.mark.parametrize("fmt", list(ExportFormat))
def test_a_model_file_read_alone_names_its_classes_and_preprocessing(
    fmt: ExportFormat, two_epochs: tuple[TrainResult, Recorder], tmp_path: Path
) -> None:
    result, _ = two_epochs
    path = tmp_path / f"model.{fmt}"
    path.write_bytes(result.models[fmt].data)
    out = subprocess.run(
        [sys.executable, "-P", "-c", READERS[fmt], str(path)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout
    found = json.loads(out)
    assert json.loads(found["classes"]) == DIGITS
    pre = json.loads(found["preprocessing"])
    assert (pre["channels"], pre["height"], pre["width"]) == (1, 28, 28)
    assert pre["layout"] == "NCHW" and pre["range"] == [0.0, 1.0]
    assert pre["fit"] == "stretch"  # a built-in set has no fit of its own
    assert pre == result.record["preprocessing"]


def test_the_check_refuses_a_format_whose_metadata_is_missing_or_changed(
    two_epochs: tuple[TrainResult, Recorder], data_dir: Path
) -> None:
    result, _ = two_epochs
    data = load_dataset("mnist-sample", data_dir)
    meta = model_metadata(data)
    x = data.test.images[:16].float().div(255)
    blob = result.models[ExportFormat.onnx].data
    expected = load_model("onnx", blob)(x)
    assert "max_abs_diff" in check_all(x, expected, {"onnx": blob}, meta)["onnx"]
    proto = onnx.load_from_string(blob)
    del proto.metadata_props[:]
    bare = proto.SerializeToString()
    assert "has no 'classes'" in check_all(x, expected, {"onnx": bare}, meta)["onnx"]["error"]
    renamed = {**meta, "classes": json.dumps(["cat"] * 10)}
    changed = check_all(x, expected, {"onnx": blob}, renamed)["onnx"]["error"]
    assert "'classes' is not the one exported" in changed

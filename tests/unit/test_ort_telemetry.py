"""onnxruntime records telemetry on POSIX hosts (a database it opens as it is imported, and
uploads) unless told not to: trainq's processes, and the checker of a model's formats, which
imports nothing of trainq, tell it."""

from __future__ import annotations

import subprocess
import sys

from core.train.checker import VERIFIER

OPEN_ONNX_FILES = """
import os
def onnx_files():
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return [f for f in found if "onnxruntime" in f.lower()]
"""


def run(code: str, *args: str) -> str:
    env = {k: v for k, v in __import__("os").environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    out = subprocess.run(
        [sys.executable, "-P", "-c", OPEN_ONNX_FILES + code, *args],
        capture_output=True, text=True, check=True, timeout=120, env=env,
    )  # fmt: skip
    return out.stdout.strip()


def test_trainq_processes_import_onnxruntime_with_its_telemetry_off() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import core, onnxruntime; print(onnx_files())"
    )
    assert run(code, str(VERIFIER.parents[2])) == "[]"


def test_the_checker_imports_onnxruntime_with_its_telemetry_off() -> None:
    code = "import runpy, sys; runpy.run_path(sys.argv[1])['warm_up'](); print(onnx_files())"
    assert run(code, str(VERIFIER)) == "[]"

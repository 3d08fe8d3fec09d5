"""The one JSON object of bench/gpu.sh: what each step left in OUTDIR, read back.

A step that failed or ran out of time shows as {"error": ...} with the tail of its log,
never as a missing key, so the report always says what ran.

    python -m bench.gpu_report OUTDIR
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import torch


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _json(out: Path, step: str) -> dict[str, Any]:
    try:
        text = (out / f"{step}.json").read_text()
        value: dict[str, Any] = json.loads(text)
        return value
    except (OSError, ValueError) as e:
        return {
            "error": f"{step} left no JSON ({type(e).__name__})",
            "log": _tail(out / f"{step}.log"),
        }


def _tests(out: Path) -> dict[str, Any]:
    """pytest's counts from its JUnit XML, and the names of the tests that did not pass."""
    try:
        root = ET.parse(out / "unit.xml").getroot()
    except (OSError, ET.ParseError) as e:
        return {"error": f"no test report ({type(e).__name__})", "log": _tail(out / "unit.log")}
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return {"error": "an empty test report", "log": _tail(out / "unit.log")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    skipped = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("skipped") is not None
    ]
    total = int(suite.get("tests", 0))
    return {
        "total": total,
        "passed": total - len(failed) - len(skipped),
        "failed": failed,
        "skipped": skipped,
        "seconds": float(suite.get("time", 0.0)),
    }


def report(out: Path) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {
        "benchmark": "gpu-acceptance",
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "data": _tail(out / "data.log", 3),
        "cuda_tests": _tests(out),
        "seed_vs_trainq": _json(out, "seed"),
        "throughput_and_memory": _json(out, "gpu"),
        "claims": _json(out, "claims") if (out / "claims.json").exists() else None,
    }


def main() -> None:
    print(json.dumps(report(Path(sys.argv[1])), indent=2))


if __name__ == "__main__":
    main()

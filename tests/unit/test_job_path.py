"""The shape of a job's path through the worker: one way an attempt ends (one place that
tells the stream, one that leaves a failed enqueue to the reconciler), and no import from
admission into execution, or from either into the reconciler."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def sources() -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): p.read_text()
        for folder in ("core", "worker", "api", "cli")
        for p in sorted((ROOT / folder).rglob("*.py"))
    }


@pytest.mark.parametrize(
    ("said", "home"),
    [
        ("could not publish its end", "worker/attempt.py"),
        ("the reconciler will", "core/queue.py"),
    ],
)
def test_each_guarded_step_of_an_end_is_written_once(said: str, home: str) -> None:
    assert [path for path, text in sources().items() if said in text] == [home]


def imports(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    } | {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}


@pytest.mark.parametrize(
    ("module", "not_into"),
    [
        ("worker/admission.py", {"worker.execution", "worker.reconciler"}),
        ("worker/execution.py", {"worker.reconciler", "worker.admission"}),
        ("worker/attempt.py", {"worker.execution", "worker.reconciler", "worker.admission"}),
    ],
)
def test_admission_execution_and_the_reconciler_import_none_of_each_other(
    module: str, not_into: set[str]
) -> None:
    assert imports(module) & not_into == set()

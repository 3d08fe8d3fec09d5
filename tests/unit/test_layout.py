"""The layout's rules, read from the source: no file over MAX_FILE_LINES lines, no function
over MAX_FUNCTION_LINES (decorators included), and which side may import which (every
import statement, at module level or inside a function)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "api", "worker", "cli", "client")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 50

# Files still over a size limit while their split is under way: path -> why. Empty it as
# each split lands; a file listed here that is within the limits fails the test.
ALLOW: dict[str, str] = {}

SERVER_PACKAGES = ("fastapi", "starlette", "sqlalchemy", "redis", "rq", "uvicorn", "alembic")
# Each rule: the files it covers (a path prefix), and the modules they may not import.
FORBIDDEN: list[tuple[str, tuple[str, ...]]] = [
    ("api/", ("worker",)),
    ("worker/", ("api",)),
    ("core/", ("api", "worker", "cli")),
    ("core/train/", (*SERVER_PACKAGES, "core.db", "core.store", "core.queue", "core.stream")),
    ("client/", ("api", "worker", "cli", *SERVER_PACKAGES)),
]
# The only trainq modules the client may import: it runs where no server code is installed.
CLIENT_MAY_IMPORT = ("client", "core.owners", "core.spec")


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((REPO / package).rglob("*.py"))


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def long_functions(tree: ast.Module, limit: int) -> list[str]:
    """`name (n lines)` for each function, nested ones too, longer than `limit`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = (node.end_lineno or node.lineno) - first + 1
            if lines > limit:
                found.append(f"{node.name} ({lines} lines)")
    return found


def size_problems(file_limit: int, function_limit: int) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {}
    for path in sources():
        found = long_functions(parsed(path), function_limit)
        lines = len(path.read_text().splitlines())
        if lines > file_limit:
            found.append(f"{lines} lines")
        if found:
            problems[relative(path)] = found
    return problems


def imported(tree: ast.Module, path: Path) -> Iterator[str]:
    """Every module (or module.name) the file imports, relative imports made absolute."""
    package = relative(path).removesuffix(".py").split("/")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], base]).strip(".")
            for alias in node.names:
                yield base if alias.name == "*" else f"{base}.{alias.name}"


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in prefixes)


def import_problems(rules: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    problems = []
    for path in sources():
        where = relative(path)
        for name in imported(parsed(path), path):
            for covered, forbidden in rules:
                if where.startswith(covered) and within(name, forbidden):
                    problems.append(f"{where} imports {name}")
    return problems


def test_no_file_or_function_is_over_its_limit() -> None:
    problems = size_problems(MAX_FILE_LINES, MAX_FUNCTION_LINES)
    assert {p: why for p, why in problems.items() if p not in ALLOW} == {}


def test_every_allowed_file_is_still_over_a_limit() -> None:
    problems = size_problems(MAX_FILE_LINES, MAX_FUNCTION_LINES)
    assert [p for p in ALLOW if p not in problems] == []


def test_the_size_check_counts_decorators_and_nested_functions() -> None:
    """The check can fail: 47 lines of body, its def and 3 of decorator make 51; a nested
    function's lines are its outer function's too."""
    decorated = '@app.get(\n    "/x",\n)\ndef f():\n' + "    x = 1\n" * 47
    nested = "def outer():\n    def inner():\n" + "        x = 1\n" * 49
    tree = ast.parse(decorated + nested)
    assert long_functions(tree, 50) == ["f (51 lines)", "outer (51 lines)"]
    assert long_functions(tree, 51) == []


def test_the_sides_import_only_what_they_may() -> None:
    assert import_problems(FORBIDDEN) == []


def test_the_client_imports_only_the_shared_contract() -> None:
    trainq = ("core", "api", "worker", "cli", "client")
    problems = [
        f"{relative(path)} imports {name}"
        for path in sorted((REPO / "client").rglob("*.py"))
        for name in imported(parsed(path), path)
        if within(name, trainq) and not within(name, CLIENT_MAY_IMPORT)
    ]
    assert problems == []


def test_the_import_check_sees_imports_inside_functions() -> None:
    """The check can fail: a rule that every side breaks (importing core) is reported,
    imports written inside functions (cli/service_cmd.py's lazy ones) included."""
    problems = import_problems([("cli/", ("core",))])
    assert "cli/service_cmd.py imports core.schema.schema_problem" in problems

"""The docs' shape, in the quick loop: the README's length, links that resolve, skipped blocks
that say why, and a settings table that matches `Settings` field for field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from core.config import Settings
from tests.docs.pages import (
    README,
    REPO,
    anchors,
    blocks,
    linked_pages,
    links,
    pages,
    settings_table,
)

MAX_README_LINES = 300


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move a topic to docs/"


@pytest.mark.parametrize("page", linked_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(page: Path) -> None:
    """Each relative link names a file that exists, and a heading of it where it has an
    anchor; links to the web are not followed."""
    broken = []
    for line, target in links(page):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{page.name}:{line}: {target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{page.name}:{line}: {target}: no heading #{anchor} in {file.name}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_skipped_blocks_say_why(page: Path) -> None:
    unexplained = [b.where for b in blocks(page) if b.skip == ""]
    assert not unexplained, f"`<!-- not run: -->` with no reason before {unexplained}"


def test_the_settings_table_names_every_setting() -> None:
    documented = set(settings_table())
    fields = {f"TRAINQ_{name.upper()}" for name in Settings.model_fields}
    assert not fields - documented, f"missing from README.md's settings: {fields - documented}"
    assert not documented - fields, f"in README.md but not in Settings: {documented - fields}"


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_the_settings_table_gives_each_default(name: str) -> None:
    """A plain default is the first `value` in its cell, as the variable would spell it;
    None, empty and computed defaults are described in words."""
    field = Settings.model_fields[name]
    cell = settings_table().get(f"TRAINQ_{name.upper()}", "")
    if field.default in (None, "") or field.default_factory is not None:
        return
    shown = cell.split("`")[1] if cell.count("`") >= 2 else cell
    assert field.annotation is not None
    value: Any = TypeAdapter(field.annotation).validate_python(shown)
    assert value == field.default, f"README.md gives {cell}; the default is {field.default!r}"

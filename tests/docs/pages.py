"""The docs as the doc tests read them: README.md, ARCHITECTURE.md and docs/*.md, their fenced
blocks (which run, which are skipped and why), their links and the README's settings table."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
RUN = ("bash", "python")  # fences the doc tests run; ```console, ```text, ```json... are shown
FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run\b:?(.*?)-->\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SETTING_ROW = re.compile(r"^\|\s*`(TRAINQ_[A-Z0-9_]+)`\s*\|([^|]*)\|")


def pages() -> list[Path]:
    """README.md, then each docs/*.md (none while there is no docs/ folder)."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def linked_pages() -> list[Path]:
    """Every page whose links must resolve: the run pages and ARCHITECTURE.md."""
    return [*pages(), REPO / "ARCHITECTURE.md"]


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, text, and the 1-based line of its opening fence."""

    page: Path
    line: int
    lang: str
    text: str
    skip: str | None  # the reason of the `<!-- not run: reason -->` line before it, or None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUN and self.skip is None


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, in order."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = opening.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines))
        body = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end])
        found.append(Block(page, i + 1, lang.lower(), body + "\n", skip_reason(lines, i)))
        i = end + 1
    return found


def skip_reason(lines: list[str], fence: int) -> str | None:
    """The reason on the `<!-- not run: ... -->` line just before the fence (blank lines
    between allowed): "" when the line gives none, None when there is no such line."""
    before = [line for line in lines[:fence] if line.strip()]
    marker = NOT_RUN.match(before[-1].strip()) if before else None
    return marker.group(1).strip() if marker else None


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of each Markdown link outside fenced blocks."""
    found, fenced = [], False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            found += [(n, target) for target in LINK.findall(line)]
    return found


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings (lower case, punctuation dropped,
    spaces to hyphens, a repeated one numbered)."""
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        heading = None if fenced else HEADING.match(line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(2).lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            if count:
                seen[f"{slug}-{count}"] = 1
    return set(seen)


def settings_table() -> dict[str, str]:
    """The README's settings table: env name to its default cell."""
    section = README.read_text().split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = (SETTING_ROW.match(line) for line in section.splitlines())
    return {row.group(1): row.group(2).strip() for row in rows if row}

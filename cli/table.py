"""Plain-text tables for the terminal: cells as the user reads them, columns aligned."""

from __future__ import annotations

from typing import Any


def cell(value: Any) -> str:
    """Floats to four significant digits; JSON's spelling of booleans and null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value)
    return str(value)


def aligned(rows: list[list[str]]) -> list[str]:
    """Each column as wide as its widest cell, two spaces apart."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]

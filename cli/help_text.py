"""A field's description as argparse's help."""

from __future__ import annotations


def help_text(description: str | None) -> str:
    """A field's description as argparse's help, which reads % as a format."""
    return (description or "").replace("%", "%%")

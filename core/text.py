"""Text a client sends that trainq keeps, compares or echoes (a data set's name, an owner id,
a cursor, an idempotency key, a class folder's name): plain text of bounded length, with no
NUL, no other C0 or C1 control character, no bidi embedding, override or mark, no line or
paragraph separator and no invisible character (a zero-width space, a word joiner, a soft
hyphen, the BOM), so that two names that look the same are the same (a 422 at the edge).
The zero-width joiner and non-joiner stay: emoji and several scripts are spelled with them.
The rule is a pattern, so that the OpenAPI document states it and pydantic enforces it
everywhere; `is_plain` checks text that pydantic never sees. See docs/api.md ("What a
client sends")."""

from __future__ import annotations

import re

PLAIN_PATTERN = (
    r"^[^\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b\u200e\u200f\u2028-\u202e"
    r"\u2060-\u206f\ufeff\ufff9-\ufffb]*$"
)
PLAIN_MESSAGE = (
    "send plain text: no NUL, tab, newline or other control character, no bidi embedding, "
    "override or mark, no line or paragraph separator, and no invisible character "
    "(zero-width space, word joiner, soft hyphen, BOM)"
)
_PLAIN = re.compile(PLAIN_PATTERN)
_SURROGATE = re.compile("[\ud800-\udfff]")


def is_plain(text: str) -> bool:
    """Whether `text` keeps the rule of PLAIN_PATTERN and holds no lone surrogate."""
    return _PLAIN.fullmatch(text) is not None and _SURROGATE.search(text) is None

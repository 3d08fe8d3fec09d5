"""Text a client sends that trainq keeps, compares or echoes (a data set's name, an owner id,
a cursor, an idempotency key, a class folder's name): plain text of bounded length, with no
NUL, no other C0 or C1 control character and no bidi embedding or override (a 422 at the
edge). The rule is a pattern, so that the OpenAPI document states it and pydantic enforces
it everywhere; `is_plain` checks text that pydantic never sees. See docs/api.md ("What a
client sends")."""

from __future__ import annotations

import re

PLAIN_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]*$"
PLAIN_MESSAGE = (
    "send plain text: no NUL, tab, newline or other control character, and no bidi "
    "embedding or override"
)
_PLAIN = re.compile(PLAIN_PATTERN)
_SURROGATE = re.compile("[\ud800-\udfff]")


def is_plain(text: str) -> bool:
    """Whether `text` keeps the rule of PLAIN_PATTERN and holds no lone surrogate."""
    return _PLAIN.fullmatch(text) is not None and _SURROGATE.search(text) is None

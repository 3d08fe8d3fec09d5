"""Text a client sends that trainq keeps, compares or echoes (a data set's name, an owner id,
a cursor, an idempotency key, a class folder's name): plain text of bounded length.
PostgreSQL refuses a NUL (in text and in JSON); the other C0 and C1 control characters
(U+0080-U+009F: NEL, CSI...) garble logs, listings and terminals; a bidi embedding or
override (U+202A-U+202E, U+2066-U+2069) makes a name read as another. Each is a 422 at the
edge, before any of it reaches the database.

The rule is a pattern, so that the OpenAPI document states it and pydantic enforces it for
query, path, header and form parameters and for body fields alike. A lone surrogate cannot
be in a pattern that pydantic's engine compiles; pydantic refuses one in any str field
itself (`string_unicode`), and `is_plain` refuses it in text that pydantic never sees."""

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

"""Text a client sends that trainq keeps, compares or echoes (a data set's name, an owner id,
a cursor, an idempotency key): plain text of bounded length. PostgreSQL refuses a NUL (in
text and in JSON) and the other control characters garble logs and listings, so each is a
422 at the edge, before any of it reaches the database.

The rule is a pattern, so that the OpenAPI document states it and pydantic enforces it for
query, path, header and form parameters and for body fields alike."""

from __future__ import annotations

PLAIN_PATTERN = r"^[^\x00-\x1f\x7f]*$"
PLAIN_MESSAGE = "send plain text: no NUL, tab, newline or other control character"

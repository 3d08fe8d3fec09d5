"""Ids as a user gives them: a whole id, or its first characters (as git and docker take a
prefix), found among the caller's own by the API's listing (client.http.Client.find_job_id,
find_sweep_id)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any

WHOLE_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIN_ID_PREFIX = 4  # the API's own minimum (api.access.IdPrefix)
ID_PREFIX = re.compile(rf"^[0-9a-f-]{{{MIN_ID_PREFIX},36}}$")
CANDIDATES_SHOWN = 5  # of an ambiguous prefix


class IdNotFound(LookupError):
    """No job (or sweep) of the key's has an id that starts so, or several have: the
    message says which, and what to give instead."""


def whole_id(kind: str, given: str, listing: Callable[[str], Iterator[dict[str, Any]]]) -> str:
    """The one id of `listing(prefix)` (the caller's own, listed by the API) that starts
    with `given`. A whole id is taken as it is: the route it goes to says if it is missing."""
    prefix = given.strip().lower()
    if WHOLE_ID.match(prefix):
        return prefix
    if not ID_PREFIX.match(prefix):
        raise IdNotFound(
            f"{given!r} is not a {kind} id: give the id or its first {MIN_ID_PREFIX} "
            "characters or more (hex digits)"
        )
    found = [str(item["id"]) for item in itertools.islice(listing(prefix), CANDIDATES_SHOWN + 1)]
    if not all(WHOLE_ID.match(i) and i.startswith(prefix) for i in found):
        # It becomes a file's name (`trainq download`): only an id may.
        raise IdNotFound(f"the API listed {found!r} for {given}: not {kind} ids")
    if not found:
        raise IdNotFound(f"no {kind} {given}")
    if len(found) > 1:
        shown = ", ".join(found[:CANDIDATES_SHOWN])
        more = " and more" if len(found) > CANDIDATES_SHOWN else ""
        raise IdNotFound(f"{kind} id {given} is ambiguous: {shown}{more}; give more of it")
    return found[0]

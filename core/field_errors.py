"""How a pydantic validation problem reads to a person: without pydantic's "Value error, "
prefix, and a misspelt field with the name it was probably meant to be. The API's 422s and
the CLI's own checks of a spec both read this way."""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from core.text import PLAIN_MESSAGE, PLAIN_PATTERN

Loc = Sequence[str | int]
PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def readable(error: Mapping[str, Any], model: Any, loc: Loc | None = None) -> str:
    """`error`'s message (one of pydantic's `errors()`), `loc` its path inside `model` (by
    default the error's own)."""
    msg = str(error.get("msg", ""))
    for prefix in PYDANTIC_PREFIXES:
        msg = msg.removeprefix(prefix)
    if error.get("type") == "string_pattern_mismatch" and (
        (error.get("ctx") or {}).get("pattern") == PLAIN_PATTERN
    ):
        msg = PLAIN_MESSAGE
    path = list(error.get("loc", ())) if loc is None else list(loc)
    if error.get("type") == "extra_forbidden" and path:
        guess = closest_field(model, path[:-1], str(path[-1]))
        if guess is not None:
            msg += f"; did you mean `{guess}`?"
    return msg


def closest_field(model: Any, parent: Loc, name: str) -> str | None:
    """The field of the model at `parent` whose name is closest to `name`, if one is close."""
    matches = difflib.get_close_matches(name, fields_at(model, parent), n=1, cutoff=0.6)
    return matches[0] if matches else None


def fields_at(model: Any, path: Loc) -> list[str]:
    """The field names of the model(s) found at `path` inside `model` (a model's fields,
    a dict's values, a list's items, through Optional and unions); none where the path leads
    to no model."""
    found: list[Any] = [model]
    for part in path:
        found = [inner for annotation in found for inner in _inside(annotation, part)]
    names = [
        field.alias or name
        for annotation in found
        for branch in _branches(annotation)
        if _is_model(branch)
        for name, field in branch.model_fields.items()
    ]
    return list(dict.fromkeys(names))


def _inside(annotation: Any, part: str | int) -> list[Any]:
    inner: list[Any] = []
    for branch in _branches(annotation):
        origin, args = get_origin(branch), get_args(branch)
        if _is_model(branch):
            field = branch.model_fields.get(str(part))
            if field is not None:
                inner.append(field.annotation)
        elif origin is dict and len(args) == 2:
            inner.append(args[1])
        elif origin in (list, tuple, set, frozenset) and args and isinstance(part, int):
            inner.append(args[0])
    return inner


def _branches(annotation: Any) -> list[Any]:
    """Annotated[X, ...] as X; X | Y as both."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _branches(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [b for arg in get_args(annotation) for b in _branches(arg)]
    return [annotation]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)

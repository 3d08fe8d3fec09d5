"""Schemathesis hooks (loaded through SCHEMATHESIS_HOOKS by the schema fuzzing): besides
what it generates from the OpenAPI, each query, path and body also comes with one of its
strings holding a NUL byte, or one of its numbers 401 digits long. Both once reached the
database or a float conversion as a 500."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import schemathesis
from hypothesis import strategies as st

NUL = "\x00"
HUGE = int("9" * 401)
MAX_VARIANTS = 16  # per generated value: its first leaves are enough for the shrinker


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    elif isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
        yield path, value


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    out = copy.deepcopy(value)
    if not path:
        return new
    node = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = new
    return out


def poisoned(value: Any) -> list[Any]:
    """`value` with one string given a NUL, or one number made 401 digits: each a copy."""
    variants = []
    for path, leaf in _leaves(value):
        bad = leaf[:1] + NUL + leaf[1:] if isinstance(leaf, str) else HUGE
        variants.append(_replaced(value, path, bad))
        if len(variants) == MAX_VARIANTS:
            break
    return variants


def _with_poison(value: Any) -> st.SearchStrategy[Any]:
    variants = poisoned(value)
    return st.one_of(st.just(value), st.sampled_from(variants)) if variants else st.just(value)


@schemathesis.hook
def flatmap_query(context: schemathesis.HookContext, query: Any) -> st.SearchStrategy[Any]:
    return _with_poison(query)


@schemathesis.hook
def flatmap_path_parameters(
    context: schemathesis.HookContext, path_parameters: Any
) -> st.SearchStrategy[Any]:
    return _with_poison(path_parameters)


@schemathesis.hook
def flatmap_body(context: schemathesis.HookContext, body: Any) -> st.SearchStrategy[Any]:
    return _with_poison(body)

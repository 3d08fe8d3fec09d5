"""Schemathesis hooks (loaded through SCHEMATHESIS_HOOKS by the schema fuzzing): besides
what it generates from the OpenAPI, each query, path and body also comes with one of its
strings holding a NUL byte, or one of its numbers 401 digits long. Both once reached the
database or a float conversion as a 500. A body also comes with one of its strings, or a
key of its own, holding a lone surrogate (JSON's `\\ud800`, valid JSON but no UTF-8): a
422 that echoed one unescaped once failed to encode as a 500."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import schemathesis
from hypothesis import strategies as st

NUL = "\x00"
HUGE = int("9" * 401)
LONE_SURROGATE = "\ud800"
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


def surrogates(body: Any) -> list[Any]:
    """`body` with one string holding a lone surrogate, or with a key of one: each a copy."""
    strings = [_replaced(body, path, leaf + LONE_SURROGATE)
               for path, leaf in _leaves(body) if isinstance(leaf, str)]  # fmt: skip
    keyed = [{**body, f"k{LONE_SURROGATE}": 1}] if isinstance(body, dict) else []
    return [*strings[: MAX_VARIANTS - 1], *keyed]


def _only_json(context: schemathesis.HookContext) -> bool:
    """A body sent as JSON escapes a surrogate; a form's bytes cannot carry one."""
    operation = context.operation
    types = operation.get_request_payload_content_types() if operation is not None else []
    return bool(types) and all("json" in t for t in types)


def _with_poison(value: Any, more: list[Any] | None = None) -> st.SearchStrategy[Any]:
    variants = poisoned(value) + (more or [])
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
    return _with_poison(body, surrogates(body) if _only_json(context) else None)

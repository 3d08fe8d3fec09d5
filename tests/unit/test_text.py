"""The plain-text rule: one pattern for pydantic and the OpenAPI, one function for the rest."""

from __future__ import annotations

import re

import pytest

from core.text import PLAIN_PATTERN, is_plain

REFUSED = [
    "nul\x00",
    "tab\t",
    "del\x7f",
    "nel\x85",  # C1 controls: U+0080 to U+009F
    "csi\x9b31m",
    "pad\x80",
    "apc\x9f",
    "lre\u202a",  # bidi embeddings and overrides
    "rlo\u202e",
    "lri\u2066",
    "pdi\u2069",
    "lrm\u200e",  # bidi marks
    "rlm\u200f",
    "alm\u061c",
    "line\u2028sep",  # line and paragraph separators: a newline by another name
    "para\u2029",
    "zw\u200bsp",  # invisible: two names that look the same would differ
    "word\u2060joiner",
    "\ufeffbom",
    "soft\xadhyphen",
    "mvs\u180e",
    "anchor\ufff9",
]
ALLOWED = ["plain", "café ÿ", "\xa0nbsp", "日本語", "emoji 🙂", "zwj\u200d", "‐dash\u2010"]


@pytest.mark.parametrize("text", REFUSED)
def test_control_bidi_and_invisible_characters_are_not_plain(text: str) -> None:
    assert re.fullmatch(PLAIN_PATTERN, text) is None
    assert not is_plain(text)


@pytest.mark.parametrize("text", ALLOWED)
def test_printable_text_is_plain(text: str) -> None:
    assert re.fullmatch(PLAIN_PATTERN, text)
    assert is_plain(text)


def test_a_lone_surrogate_is_not_plain() -> None:
    assert not is_plain("x\ud800")
    assert not is_plain("\udfff")

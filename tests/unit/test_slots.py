"""KeySlots without services: a key's share, the process's limit, and release."""

from __future__ import annotations

import pytest

from api.slots import KeySlots, SlotLimit
from core.errors import ProcessBusy


def slots() -> KeySlots:
    return KeySlots(
        "uploads being checked",
        per_key=SlotLimit("upload_max_per_key", 1),
        per_process=SlotLimit("max_parallel_uploads", 3),
    )


def test_a_key_past_its_share_is_refused_and_the_others_go_on() -> None:
    held = slots()
    held.take("alice")
    with pytest.raises(ProcessBusy) as refused:
        held.take("alice")
    assert refused.value.limit == "upload_max_per_key" and refused.value.retry_after_s
    assert refused.value.message.startswith("this key has 1 uploads being checked already")
    held.take("bob")
    held.take("carol")
    with pytest.raises(ProcessBusy) as full:
        held.take("dave")
    assert full.value.limit == "max_parallel_uploads"
    held.release("alice")
    held.take("dave")
    assert held.open == {"bob": 1, "carol": 1, "dave": 1}


def test_held_releases_however_the_block_ends() -> None:
    held = slots()
    with pytest.raises(ValueError), held.held("alice"):
        raise ValueError("the parse failed")
    with held.held("alice"):
        assert held.open == {"alice": 1}
    assert not held.open

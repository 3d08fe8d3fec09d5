from __future__ import annotations

import pytest

from api.auth import KeyRing, key_digest, owner_id


def test_plain_and_hashed_keys_are_both_accepted() -> None:
    ring = KeyRing(["alice-key", f"sha256:{key_digest('bob-key')}"], ["root-key"])
    alice, bob, root = ring.check("alice-key"), ring.check("bob-key"), ring.check("root-key")
    assert alice is not None and not alice.admin and alice.owner == owner_id("alice-key")
    assert bob is not None and bob.owner == owner_id("bob-key")
    assert root is not None and root.admin
    assert ring.check("") is None
    assert ring.check("alice-key ") is None
    assert ring.check(key_digest("bob-key")) is None  # the digest itself is not a key


def test_no_keys_is_an_error() -> None:
    with pytest.raises(ValueError, match="TRAINQ_API_KEYS"):
        KeyRing([], [])

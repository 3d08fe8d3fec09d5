"""API keys. Each key in TRAINQ_API_KEYS is an owner and sees only its own jobs; a key in
TRAINQ_ADMIN_KEYS sees all. Keys are compared in constant time and never stored: an owner
is known by a hash of its key."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    owner: str  # a stable, non-secret id derived from the key
    admin: bool


def owner_id(key: str) -> str:
    return "k_" + hashlib.sha256(key.encode()).hexdigest()[:16]


class KeyRing:
    def __init__(self, keys: list[str], admin_keys: list[str]) -> None:
        self._keys = [(k.encode(), False) for k in keys] + [(k.encode(), True) for k in admin_keys]
        if not self._keys:
            raise ValueError("no API keys configured: set TRAINQ_API_KEYS")

    def check(self, presented: str) -> Caller | None:
        found: Caller | None = None
        raw = presented.encode()
        for key, admin in self._keys:  # no early exit: the time does not depend on which key
            if hmac.compare_digest(key, raw):
                found = Caller(owner=owner_id(presented), admin=admin)
        return found

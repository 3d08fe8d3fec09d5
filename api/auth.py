"""API keys. Each key in TRAINQ_API_KEYS is an owner and sees only its own jobs; a key in
TRAINQ_ADMIN_KEYS sees all. Keys are compared in constant time; an owner is known by a
hash of its key, so keys are never stored with the jobs. A configured entry may itself be
`sha256:<hex digest of the key>`, so the server's environment need not hold the key."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

HASHED = "sha256:"


@dataclass(frozen=True)
class Caller:
    owner: str  # a stable, non-secret id derived from the key
    admin: bool


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def owner_id(key: str) -> str:
    return "k_" + key_digest(key)[:16]


class KeyRing:
    def __init__(self, keys: list[str], admin_keys: list[str]) -> None:
        entries = [(k, False) for k in keys] + [(k, True) for k in admin_keys]
        if not entries:
            raise ValueError("no API keys configured: set TRAINQ_API_KEYS")
        # Everything is compared as a sha256 digest: fixed length, constant time.
        self._digests = [
            (k.removeprefix(HASHED).lower() if k.startswith(HASHED) else key_digest(k), admin)
            for k, admin in entries
        ]

    def check(self, presented: str) -> Caller | None:
        digest = key_digest(presented)
        found: Caller | None = None
        for known, admin in self._digests:  # no early exit: the time does not depend on which
            if hmac.compare_digest(known, digest):
                found = Caller(owner=owner_id(presented), admin=admin)
        return found

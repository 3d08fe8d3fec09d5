"""Who owns a job: the owner an API key names. The API gives a job submitted with a key this
owner, and a producer that enqueues straight onto the queue passes the same value as
`owner=`; then that key sees the job. Only a hash of the key is ever stored with jobs.
See docs/queue.md ("Owners")."""

from __future__ import annotations

import hashlib


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def owner_id(key: str) -> str:
    return digest_owner_id(key_digest(key))


def digest_owner_id(digest: str) -> str:
    """The owner id of the key whose sha256 hex digest this is."""
    return "k_" + digest[:16]

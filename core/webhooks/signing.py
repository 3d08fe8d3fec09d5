"""Standard Webhooks signatures (https://www.standardwebhooks.com): a secret `whsec_<base64>`
of 32 random bytes per endpoint, and `webhook-signature: v1,<base64 HMAC-SHA256>` over
`{webhook-id}.{webhook-timestamp}.{body}`, keyed by the secret's decoded bytes, so that
the verifier libraries of that convention check trainq's deliveries unchanged."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"
SECRET_BYTES = 32  # the convention asks for 24 to 64


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key a `whsec_` secret stands for."""
    return base64.b64decode(secret.removeprefix(PREFIX))


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value for one attempt."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """What every attempt sends: the same `webhook-id` at each retry, its own timestamp."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, msg_id, timestamp, body),
        "content-type": "application/json",
    }

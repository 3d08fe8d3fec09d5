"""Signatures as Standard Webhooks prescribes: checked by a verifier written from the
convention's text and by the `standardwebhooks` package's own (where it is installed), and
the event names the light CLI spells held to the server's."""

from __future__ import annotations

import time

import pytest

from cli.resource_options import WEBHOOK_EVENTS
from core.webhooks.outbox import EventType
from core.webhooks.signing import headers, new_secret, secret_key, signature
from tests.webhook_receiver import Received, verify, verify_with_library

BODY = b'{"type":"job.succeeded","timestamp":"2026-12-10T10:00:00+00:00","data":{"a":1}}'


def signed(secret: str, body: bytes = BODY) -> Received:
    return Received(headers(secret, "evt_1", int(time.time()), body), body, time.time())


def test_a_secret_is_whsec_and_32_random_bytes() -> None:
    a, b = new_secret(), new_secret()
    assert a.startswith("whsec_") and a != b
    assert len(secret_key(a)) == 32


def test_the_convention_s_verifier_accepts_a_signature() -> None:
    secret = new_secret()
    verify(secret, signed(secret))


def test_the_standardwebhooks_package_accepts_a_signature() -> None:
    secret = new_secret()
    if not verify_with_library(secret, signed(secret)):
        pytest.skip("the standardwebhooks package is not installed")


def test_a_changed_body_or_another_secret_is_refused() -> None:
    secret = new_secret()
    got = signed(secret)
    with pytest.raises(AssertionError):
        verify(secret, Received(got.headers, BODY + b" ", got.at))
    with pytest.raises(AssertionError):
        verify(new_secret(), got)


def test_the_signature_is_the_known_answer() -> None:
    """The convention's own test vector (its reference libraries' tests)."""
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    assert signature(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


def test_the_cli_names_every_event_type() -> None:
    assert list(WEBHOOK_EVENTS) == [e.value for e in EventType]

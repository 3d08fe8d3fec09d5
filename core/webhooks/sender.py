"""One delivery attempt: a POST to the address the URL's host resolved to when it was checked
(core.webhooks.addresses), never resolved again, with the URL's host in the Host header and,
over https, as the TLS server name (so the certificate is checked against it). No redirect is
followed (a 3xx is a failure), the whole attempt has a deadline, and at most a few KiB of the
answer are read."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from enum import StrEnum

import httpx

from core.webhooks.addresses import Target

ANSWER_BYTES = 4096  # of an answer's body, kept for the delivery log; the rest is not read
ERROR_CHARS = 500
USER_AGENT = "trainq-webhooks"


class AttemptOutcome(StrEnum):
    """An attempt's outcome as /metrics counts it (trainq_webhook_attempts_total)."""

    delivered = "delivered"  # a 2xx
    rejected = "rejected"  # any other answer, a redirect among them
    no_answer = "no_answer"  # no connection, or no answer within the deadline
    not_sent = "not_sent"  # no request made: its address refused, or none could carry it


@dataclass(frozen=True)
class Outcome:
    """What an attempt came to: the status code (None: no answer), its time, why it failed
    (None: a 2xx), and whether a request was sent at all."""

    status_code: int | None
    latency_ms: float
    error: str | None
    sent: bool = True

    @property
    def delivered(self) -> bool:
        return self.error is None

    @property
    def kind(self) -> AttemptOutcome:
        if self.delivered:
            return AttemptOutcome.delivered
        if not self.sent:
            return AttemptOutcome.not_sent
        return AttemptOutcome.no_answer if self.status_code is None else AttemptOutcome.rejected


def http_client(connect_timeout_s: float, timeout_s: float) -> httpx.AsyncClient:
    """The dispatcher's client: no proxy from the environment, no redirects, no connection
    kept between attempts (each attempt connects to the address it checked, under the name
    it checked)."""
    return httpx.AsyncClient(
        trust_env=False,
        follow_redirects=False,
        timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
        limits=httpx.Limits(max_keepalive_connections=0),
    )


async def post(
    client: httpx.AsyncClient,
    target: Target,
    headers: dict[str, str],
    body: bytes,
    deadline_s: float,
) -> Outcome:
    """POST `body` to `target` within `deadline_s`, whatever the server does meanwhile."""
    request = client.build_request(
        "POST",
        target.pinned_url,
        content=body,
        headers={**headers, "host": target.host_header, "user-agent": USER_AGENT},
        extensions={"sni_hostname": target.host} if target.scheme == "https" else {},
    )
    started = time.monotonic()
    try:
        async with asyncio.timeout(deadline_s):
            status, answer = await _exchange(client, request)
    except TimeoutError:
        return failed(started, None, f"no answer within {deadline_s:g} s")
    except httpx.HTTPError as e:
        return failed(started, None, f"{type(e).__name__}: {e}")
    if 200 <= status < 300:
        return Outcome(status, _ms(started), None)
    told = answer.decode("utf-8", "replace").strip()
    why = f"answered {status}" + (" (a redirect: none is followed)" if 300 <= status < 400 else "")
    return failed(started, status, f"{why}: {told}" if told else why)


async def _exchange(client: httpx.AsyncClient, request: httpx.Request) -> tuple[int, bytes]:
    response = await client.send(request, stream=True)
    try:
        answer = b""
        async for chunk in response.aiter_raw():
            answer += chunk
            if len(answer) >= ANSWER_BYTES:
                break
        return response.status_code, answer[:ANSWER_BYTES]
    finally:
        await response.aclose()


def failed(started: float, status: int | None, why: str, *, sent: bool = True) -> Outcome:
    """A failure, its reason as the log stores it: a NUL (a receiver's binary error page),
    which PostgreSQL's text refuses, shown as U+FFFD, so that the outcome is always stored
    and the delivery backs off. `sent`: False where no request was made."""
    shown = why[:ERROR_CHARS].replace("\x00", "\ufffd")
    return Outcome(status, _ms(started), shown, sent)


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)

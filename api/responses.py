"""The OpenAPI `responses` of the routes, named once: a route lists what it may answer as
`{**NO_KEY, **NO_JOB, ...}`. They document; api/errors.py decides. See docs/api.md."""

from __future__ import annotations

from typing import Any

from api.schemas import QUOTA_REFUSAL, Problem, QuotaProblem

Responses = dict[int | str, dict[str, Any]]


def problem(description: str) -> dict[str, Any]:
    """One status answered with a `Problem` body."""
    return {"model": Problem, "description": description}


NO_KEY: Responses = {401: problem("Missing or unknown API key.")}
NOT_ADMIN: Responses = {403: problem("Not an admin key.")}
NO_JOB: Responses = {404: problem("No such job (or not yours).")}
NO_SWEEP: Responses = {404: problem("No such sweep (or not yours).")}
NO_DATASET: Responses = {404: problem("No such data set (or not yours).")}
KEY_REUSED: Responses = {409: problem("Idempotency-Key reused with another body.")}
OVER_QUOTA: Responses = {429: {"model": QuotaProblem, "description": QUOTA_REFUSAL}}
TOO_MANY_STREAMS: Responses = {
    429: problem(
        "Too many event streams open at once, for this key or this API process: `limit` "
        "names the setting, `allowed` its value; see Retry-After."
    )
}
EVENT_STREAM: Responses = {200: {"content": {"text/event-stream": {}}}}
UNAVAILABLE: Responses = {503: problem("Queue or database unavailable.")}
TOO_LARGE: Responses = {413: problem("Over a size limit (bytes, images, zip bomb).")}

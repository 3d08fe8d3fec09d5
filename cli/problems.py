"""How a failure a user can meet reads on the terminal, and the exit code it gives (the
list is `trainq --help`'s): an API refusal one line, a 422 each field that is wrong (exit 2,
as argparse does for a bad flag), a 429 the quota and when to retry; an id that names no
job, or several; an API that cannot be reached, one line and exit 69. The server's text
is shown escaped (`shown`): a server that is not trainq's could otherwise send escape
sequences to the terminal, or a line break and a forged line."""

from __future__ import annotations

import re
import sys
import unicodedata
from typing import Any

import httpx
from pydantic import ValidationError

from client.http import ApiError, IdNotFound

INVALID = 2
UNREACHABLE = 69  # sysexits.h's EX_UNAVAILABLE: a service the command needs is not there
INTERRUPTED = 130  # the shell's code for a command stopped by ^C
# Control characters (C0, DEL, C1), format characters (bidi overrides, zero-width ones) and
# lone surrogates: each is shown as its escape, `\x1b`, `\u202e`.
HIDDEN = ("Cc", "Cf", "Cs")


def shown(text: object) -> str:
    """`text` as one line that the terminal shows as it is, with no character that moves
    the cursor, changes colours, the title or the reading order."""
    return "".join(
        ch.encode("unicode_escape").decode() if unicodedata.category(ch) in HIDDEN else ch
        for ch in str(text)
    )


def exit_code(e: Exception) -> int | None:
    """Print `e` as one message and return the command's exit code; None for an exception
    no user can cause (a bug, whose traceback is wanted)."""
    if isinstance(e, ApiError):
        return refused(e)
    if isinstance(e, IdNotFound):
        print(f"trainq: {shown(e)}", file=sys.stderr)
        return 1
    if isinstance(e, httpx.TransportError):
        print(f"trainq: {shown(unreachable(e))}", file=sys.stderr)
        return UNREACHABLE
    if isinstance(e, ValidationError):
        from core.errors import field_problems
        from core.spec import JobSpec

        model = JobSpec if e.title == JobSpec.__name__ else None
        what = "job spec" if model else e.title
        print("\n  ".join([f"invalid {what}:", *field_problems(e, model)]), file=sys.stderr)
        return INVALID
    return None


def unreachable(e: httpx.TransportError) -> str:
    """`cannot reach the API at http://host:port: connection refused` where no connection
    was made; where one was and then ended (the API stopped mid-request, a proxy cut it),
    that it was reached and gave no answer: the request may or may not have taken effect."""
    try:
        url = e.request.url
        where = f"{url.scheme}://{url.netloc.decode()}"
    except RuntimeError:  # an error raised before its request was made
        where = "its address"
    why = re.sub(r"^\[Errno -?\d+\] ", "", str(e)).strip() or type(e).__name__
    why = f"{why[:1].lower()}{why[1:]}"
    if isinstance(e, httpx.ConnectError | httpx.ConnectTimeout | httpx.UnsupportedProtocol):
        return f"cannot reach the API at {where}: {why}"
    what = "did not answer in time" if isinstance(e, httpx.TimeoutException) else (
        "ended the connection before it answered (it may have stopped or restarted)"
    )  # fmt: skip
    return f"the API at {where} {what}: {why}; the request may or may not have taken effect"


def refused(e: ApiError, what: str = "the request") -> int:
    """Print what the API refused and why; the command's exit code."""
    if e.status == 422:
        lines = [f"trainq: {what} is refused:", *(f"  {p}" for p in field_problems(e.detail))]
        print("\n".join(lines), file=sys.stderr)
        return INVALID
    if e.status == 429:
        print(f"trainq: {shown(quota_message(e))}", file=sys.stderr)
        return 1
    print(f"trainq: {shown(e.detail)}", file=sys.stderr)
    return 1


def field_problems(detail: Any) -> list[str]:
    """FastAPI's 422 detail as `space.lr: message` lines (the path is `loc` past the body)."""
    if not isinstance(detail, list):
        return [shown(detail)]
    lines = []
    for problem in detail:
        if not isinstance(problem, dict):
            lines.append(shown(problem))
            continue
        path = [str(p) for p in problem.get("loc", []) if p != "body"]
        lines.append(shown(f"{'.'.join(path) or 'body'}: {problem.get('msg', problem)}"))
    return lines


def quota_message(e: ApiError) -> str:
    body = e.body
    text = str(e.detail)
    if "limit" in body and "value" in body:
        text += f" ({body['limit']}: {body.get('usage')} of {body['value']} in use)"
    wait = body.get("retry_after_s") or e.retry_after
    return f"{text}; retry after {wait} s" if wait else f"{text}; waiting will not help"

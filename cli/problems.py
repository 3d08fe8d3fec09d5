"""How an API refusal reads on the terminal, and the exit code it gives: a 422 names each
field that is wrong (exit 2, as argparse does for a bad flag), a 429 the quota and when to
retry."""

from __future__ import annotations

import sys
from typing import Any

from client.http import ApiError

INVALID = 2


def refused(e: ApiError, what: str = "the request") -> int:
    """Print what the API refused and why; the command's exit code."""
    if e.status == 422:
        lines = [f"trainq: {what} is refused:", *(f"  {p}" for p in field_problems(e.detail))]
        print("\n".join(lines), file=sys.stderr)
        return INVALID
    if e.status == 429:
        print(f"trainq: {quota_message(e)}", file=sys.stderr)
        return 1
    print(f"trainq: {e.detail}", file=sys.stderr)
    return 1


def field_problems(detail: Any) -> list[str]:
    """FastAPI's 422 detail as `space.lr: message` lines (the path is `loc` past the body)."""
    if not isinstance(detail, list):
        return [str(detail)]
    lines = []
    for problem in detail:
        path = [str(p) for p in problem.get("loc", []) if p != "body"]
        lines.append(f"{'.'.join(path) or 'body'}: {problem.get('msg', problem)}")
    return lines


def quota_message(e: ApiError) -> str:
    body = e.body
    text = str(e.detail)
    if "limit" in body and "value" in body:
        text += f" ({body['limit']}: {body.get('usage')} of {body['value']} in use)"
    wait = body.get("retry_after_s") or e.retry_after
    return f"{text}; retry after {wait} s" if wait else f"{text}; waiting will not help"

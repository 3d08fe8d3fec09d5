"""Errors to status codes, in one place: the named errors of core.errors, bad input,
outages. Nothing a client sends becomes a 500. See docs/api.md."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import OutOfMemoryError, RedisError
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm.exc import ObjectDeletedError
from starlette.exceptions import HTTPException

from api.images import DecodeBusy
from core.errors import (
    AliasChanged,
    AlreadyEnded,
    DatasetInUse,
    EndpointDisabled,
    IdempotencyKeyReused,
    InvalidRequest,
    JobActive,
    JobRegistered,
    ModelDamaged,
    ModelPurged,
    NoModel,
    NoRecord,
    NotFound,
    ProcessBusy,
    QuotaExceeded,
    ReadOnlyModel,
    TooLarge,
    TooManyFollowers,
    TrainqError,
    Unavailable,
    UnsupportedMediaType,
    VersionInUse,
)
from core.field_errors import readable

log = logging.getLogger("trainq.api")
JSON_HINT = "send a JSON object with Content-Type: application/json"
# The named errors a route lets through, and what each answers (a subclass answers as its
# base: api.services.submitter.OutcomeUnknown is Unavailable).
STATUS: dict[type[TrainqError], int] = {
    NotFound: 404,
    AlreadyEnded: 409,
    NoModel: 409,
    NoRecord: 409,
    IdempotencyKeyReused: 409,
    JobActive: 409,
    DatasetInUse: 409,
    JobRegistered: 409,
    AliasChanged: 409,
    VersionInUse: 409,
    ReadOnlyModel: 403,
    EndpointDisabled: 409,
    ModelPurged: 410,
    TooLarge: 413,
    UnsupportedMediaType: 415,
    InvalidRequest: 422,
    ModelDamaged: 500,  # the stored bytes, not the request: retrying does not help
    Unavailable: 503,
}
RETRY_AFTER_S = "5"
MAX_ECHO = 200  # characters of a refused input a 422 sends back
# A full Redis frees memory as streams of ended jobs expire, or when an operator acts:
# seconds are not enough.
FULL_RETRY_AFTER_S = "30"


def _json_safe(value: Any) -> Any:
    """JSON has no NaN or Infinity: echo them back as strings. A lone surrogate (JSON's
    `\\ud800`, which json.loads accepts) has no UTF-8: echo it escaped, as the text `\\ud800`."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def install(app: FastAPI) -> None:
    """Every error a route may let through, mapped to its answer."""
    _install_bad_input(app)
    _install_refusals(app)
    _install_outages(app)


def _install_bad_input(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """422 naming each field (`loc`), also when the input held NaN or Infinity, each
        message as a person reads it."""
        problems = [_echoed(_problem(request, error)) for error in exc.errors()]
        return JSONResponse({"detail": _json_safe(jsonable_encoder(problems))}, 422)

    @app.exception_handler(UnicodeEncodeError)
    async def lone_surrogate(request: Request, exc: UnicodeEncodeError) -> Response:
        """pydantic reads a lone surrogate in a JSON string as `string_unicode`, but one in a
        map's key (a sweep's `space`) escapes it as this error: the client's text, a 422."""
        if exc.reason != "surrogates not allowed":
            raise exc
        what = _json_safe(exc.object[max(exc.start - 20, 0) : exc.end + 20])
        msg = f"a string holds a lone surrogate (near {what!r}): send text as valid UTF-8"
        problem = {"type": "string_unicode", "loc": ["body"], "msg": msg}
        return JSONResponse({"detail": [problem]}, 422)

    @app.exception_handler(HTTPException)
    async def refused_by_route(request: Request, exc: HTTPException) -> Response:
        """A refusal of FastAPI's or of a body reader's, as FastAPI answers it, its detail
        made JSON-safe: a detail may quote what the client sent. A form whose files could
        not be spooled (the temporary folder full or not writable) is this machine's
        fault, not the body's: 503, as a download that cannot be staged answers."""
        if exc.status_code == 400 and isinstance(exc.__cause__, OSError):
            what = (
                "the API has no room to take the upload (its temporary folder is full or "
                "not writable)"
            )
            return _unavailable(what, exc.__cause__)
        safe = HTTPException(exc.status_code, _json_safe(exc.detail), exc.headers)
        return await http_exception_handler(request, safe)


def _install_refusals(app: FastAPI) -> None:
    async def refused(_: Request, exc: Exception) -> JSONResponse:
        """trainq's named refusals (core.errors), each with its status code."""
        assert isinstance(exc, TrainqError)
        return named_refusal(exc)

    for error in STATUS:
        app.add_exception_handler(error, refused)

    @app.exception_handler(QuotaExceeded)
    async def over_quota(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, QuotaExceeded)
        return quota_refusal(exc)

    @app.exception_handler(ProcessBusy)
    async def process_busy(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProcessBusy)
        return busy_refusal(exc)

    @app.exception_handler(ObjectDeletedError)
    async def deleted_meanwhile(_: Request, exc: Exception) -> JSONResponse:
        """A row this request had read was deleted by another before the request could read
        it again (a job deleted the moment its cancel committed): gone, a 404."""
        log.info("a row was deleted while a request used it: %s", exc)
        return named_refusal(NotFound("it was deleted while this request ran"))


def _install_outages(app: FastAPI) -> None:
    @app.exception_handler(RedisError)
    async def redis_away(_: Request, exc: Exception) -> JSONResponse:
        """Any Redis failure, not only a lost connection: a refused command (a server out
        of memory, a read-only replica, a loading one) is as retryable for the client."""
        if out_of_memory(exc):
            what = "the queue (Redis) is full: it refuses writes past its maxmemory"
            return _unavailable(what, exc, FULL_RETRY_AFTER_S)
        return _unavailable("the queue (Redis) is unavailable or refused the command", exc)

    @app.exception_handler(DecodeBusy)
    async def decodes_busy(_: Request, exc: Exception) -> JSONResponse:
        return _unavailable(str(exc), exc)

    @app.exception_handler(PoolTimeout)
    async def pool_exhausted(_: Request, exc: Exception) -> JSONResponse:
        return _unavailable("every database connection of this API process is in use", exc)

    @app.exception_handler(OperationalError)
    async def database_busy(_: Request, exc: Exception) -> JSONResponse:
        return database_problem(exc)


def named_refusal(exc: TrainqError) -> JSONResponse:
    """`{"detail": ...}` with the status of the error's class (or of its nearest base in
    STATUS); 422 carries its problems, 503 a Retry-After."""
    status = next(STATUS[c] for c in type(exc).__mro__ if c in STATUS)
    detail: Any = exc.problems if isinstance(exc, InvalidRequest) else exc.message
    headers = {"Retry-After": RETRY_AFTER_S} if isinstance(exc, Unavailable) else None
    return JSONResponse({"detail": _json_safe(detail)}, status_code=status, headers=headers)


def _echoed(problem: dict[str, Any]) -> dict[str, Any]:
    """The problem with its `input` cut short: a refusal names what was wrong, it does not
    send a long input back (a 200 KB name came back whole)."""
    if "input" not in problem:
        return problem
    value = problem["input"]
    if isinstance(value, str | bytes) and len(value) > MAX_ECHO:
        return {**problem, "input": f"{value[:MAX_ECHO]!s}... ({len(value)} characters)"}
    if isinstance(value, dict | list | tuple) and len(repr(value)) > 4 * MAX_ECHO:
        kind = "an object" if isinstance(value, dict) else "an array"
        return {**problem, "input": f"({kind} of {len(value)} items, not echoed)"}
    return problem


def _problem(request: Request, error: dict[str, Any]) -> dict[str, Any]:
    """The error with a readable `msg`: a body that is no JSON object says so, a misspelt
    field names the one it was probably meant to be (core.field_errors)."""
    loc = list(error.get("loc", ()))
    if loc[:1] != ["body"]:
        return {**error, "msg": readable(error, None)}
    body = _not_a_json_object(request, error)
    if body is not None:
        return {**error, "msg": body}
    return {**error, "msg": readable(error, _body_model(request), loc[1:])}


def _not_a_json_object(request: Request, error: dict[str, Any]) -> str | None:
    """What is wrong with a body that is not a JSON object as a whole (a form, text, an
    empty body, broken JSON, an array), or None."""
    kind = error.get("type")
    if kind == "json_invalid":
        why = (error.get("ctx") or {}).get("error", "decode error")
        return f"the body is not valid JSON ({why}): {JSON_HINT}"
    if tuple(error.get("loc", ())) != ("body",):
        return None
    if kind == "missing":
        return f"the body is empty: {JSON_HINT}"
    content_type = request.headers.get("content-type")
    if not _is_json(content_type):
        return (
            f"the body was not read as JSON (Content-Type: {content_type or 'none'}): {JSON_HINT}"
        )
    if kind in ("model_attributes_type", "dict_type"):
        return f"the body is JSON but not an object: {JSON_HINT}"
    return None


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").partition(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _body_model(request: Request) -> Any:
    """The type the matched route reads its body as (None for a route without one)."""
    field = getattr(request.scope.get("route"), "body_field", None)
    return field.field_info.annotation if field is not None else None


def quota_refusal(exc: QuotaExceeded | ProcessBusy) -> JSONResponse:
    """429 naming the limit, its value, the key's usage of it and the key's owner id, with
    Retry-After where waiting helps (api.schemas.QuotaProblem)."""
    body = {
        "detail": exc.message,
        "limit": exc.limit,
        "value": exc.value,
        "usage": exc.usage,
        "owner": exc.owner,
        "retry_after_s": exc.retry_after_s,
    }
    headers = {} if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}
    return JSONResponse(body, status_code=429, headers=headers)


def busy_refusal(exc: ProcessBusy) -> JSONResponse:
    """429 with Retry-After: this process holds all it may at once. Event streams name the
    limit and its value (`allowed`); downloads and uploads answer as a quota does."""
    if not isinstance(exc, TooManyFollowers):
        return quota_refusal(exc)
    body = {"detail": exc.message, "limit": exc.limit, "allowed": exc.allowed}
    return JSONResponse(body, status_code=429, headers={"Retry-After": str(exc.retry_after_s)})


def out_of_memory(exc: Exception) -> bool:
    """Redis refused a write past its maxmemory: the OOM reply, also as a script's error
    (a script's refused write comes back as a plain error that quotes it)."""
    return isinstance(exc, OutOfMemoryError) or "OOM command not allowed" in str(exc)


def _unavailable(what: str, exc: Exception, retry_after_s: str = RETRY_AFTER_S) -> JSONResponse:
    """503 + Retry-After: the client did nothing wrong and may simply try again."""
    log.warning("%s: %s", what, exc)
    return JSONResponse(
        {"detail": f"{what}; retry shortly"},
        status_code=503,
        headers={"Retry-After": retry_after_s},
    )


# SQLite's "database or disk is full"; PostgreSQL's disk_full (53100) and "No space left".
_DISK_FULL = ("database or disk is full", "no space left on device", "disk full")


def database_problem(exc: Exception) -> JSONResponse:
    """A database that refused a write for lack of disk: 507, which a retry will not mend
    until an operator frees space; any other operational error: 503, busy or away."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).lower()
    if getattr(orig, "sqlstate", None) == "53100" or any(s in text for s in _DISK_FULL):
        log.error("the database's disk is full: %s", exc)
        return JSONResponse(
            {"detail": "the database's disk is full: nothing was written; an operator must "
                       "free space before this can succeed"},
            status_code=507,
        )  # fmt: skip
    return _unavailable("the database is busy or unavailable", exc)

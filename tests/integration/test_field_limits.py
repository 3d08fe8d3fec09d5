"""Every text field and every number of every route, read from the app's own OpenAPI
document: a NUL byte in a string and a 401-digit integer in a number are 4xx, never a 500,
on SQLite and PostgreSQL (which refuses NUL in text and in JSON, and integers past BIGINT).
A JSON body's strings and keys also get a lone surrogate (`\\ud800`: valid JSON, no UTF-8),
which a 422 that echoes it must escape.

The walk is generic: a route added later is walked too. Each bad value is sent alone, in a
request otherwise as valid as the walk can make it, so that it reaches as deep as it can."""

from __future__ import annotations

import io
import json
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import numpy as np
import pytest

from core.text import PLAIN_MESSAGE
from tests.service import Service

NUL = "a\x00b"
HUGE = int("9" * 401)
LONE_SURROGATE = "a\ud800b"
SKIPPED_PATHS = ("/jobs/{job_id}/events", "/sweeps/{sweep_id}/events")  # streams: one read


@dataclass
class Call:
    """One request of the walk, and what in it is bad."""

    method: str
    path: str  # the template, for the report
    what: str
    params: dict[str, str] = field(default_factory=dict)
    path_params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    json: Any = None
    form: dict[str, str] | None = None


def npz_upload() -> bytes:
    """The smallest data set an upload accepts: 40 images of two classes."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (40, 8, 8), dtype=np.uint8)
    y = np.arange(40) % 2
    buf = io.BytesIO()
    np.savez(buf, x_train=x[:30], y_train=y[:30], x_test=x[30:], y_test=y[30:])
    return buf.getvalue()


def kinds(doc: dict[str, Any], schema: dict[str, Any]) -> set[str]:
    """The JSON types a schema admits, through $ref, anyOf and oneOf."""
    schema = deref(doc, schema)
    found = {schema["type"]} if isinstance(schema.get("type"), str) else set()
    for option in schema.get("anyOf", []) + schema.get("oneOf", []) + schema.get("allOf", []):
        found |= kinds(doc, option)
    return found


def deref(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = doc
        for part in str(schema["$ref"]).removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def bad_values(
    doc: dict[str, Any], schema: dict[str, Any], in_json: bool = False
) -> Iterator[tuple[str, Any]]:
    """Only JSON can carry a lone surrogate: a URL, a header or a form field is bytes."""
    admitted = kinds(doc, schema)
    if "string" in admitted:
        yield "NUL", NUL
        if in_json:
            yield "lone surrogate", LONE_SURROGATE
    if admitted & {"integer", "number"}:
        yield "401 digits", HUGE


def leaves(
    doc: dict[str, Any], schema: dict[str, Any], depth: int = 0
) -> Iterator[tuple[list[str | int], str, Any]]:
    """(path, what, bad value) for each string or number inside a body's schema: objects'
    properties and additionalProperties, arrays' items, through $ref and anyOf."""
    schema = deref(doc, schema)
    yield from (([], what, v) for what, v in bad_values(doc, schema, in_json=True) if depth)
    if not depth and "properties" in schema:  # an unknown key, which a 422 names in its loc
        yield [LONE_SURROGATE], "lone surrogate key", 1
    if depth > 4:
        return
    options = [deref(doc, s) for s in schema.get("anyOf", []) + schema.get("oneOf", [])]
    for option in [schema, *options]:
        for name, sub in option.get("properties", {}).items():
            for path, what, v in leaves(doc, sub, depth + 1):
                yield [name, *path], what, v
        extra = option.get("additionalProperties")
        if isinstance(extra, dict):
            for path, what, v in leaves(doc, extra, depth + 1):
                yield ["epochs", *path], what, v  # a known key (a JobSpec field): its value is read
            yield [NUL], "NUL key", 1
            yield [LONE_SURROGATE], "lone surrogate key", 1
        if isinstance(option.get("items"), dict):
            for path, what, v in leaves(doc, option["items"], depth + 1):
                yield [0, *path], what, v
        for i, item in enumerate(option.get("prefixItems", [])):
            for path, what, v in leaves(doc, item, depth + 1):
                yield [i, *path], what, v


def nested(path: list[str | int], value: Any) -> Any:
    """{"a": [{"b": value}]} for the path ["a", 0, "b"]."""
    for step in reversed(path):
        value = [value] if isinstance(step, int) else {step: value}
    return value


def placeholder(doc: dict[str, Any], schema: dict[str, Any]) -> str:
    schema = deref(doc, schema)
    if schema.get("format") == "uuid":
        return str(uuid.uuid4())
    if "integer" in kinds(doc, schema):
        return "1"
    return "x"


def calls(doc: dict[str, Any]) -> Iterator[Call]:
    for path, ops in doc["paths"].items():
        if path in SKIPPED_PATHS:
            continue
        for method, op in ops.items():
            params = op.get("parameters", [])
            base = {p["name"]: placeholder(doc, p.get("schema", {})) for p in params
                    if p["in"] == "path"}  # fmt: skip
            for p in params:
                for what, v in bad_values(doc, p.get("schema", {})):
                    call = Call(method, path, f"{p['in']} {p['name']}: {what}",
                                path_params=dict(base))  # fmt: skip
                    {"path": call.path_params, "query": call.params,
                     "header": call.headers}.get(p["in"], {})[p["name"]] = str(v)  # fmt: skip
                    yield call
            content = op.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                for loc, what, v in leaves(doc, content["application/json"]["schema"]):
                    yield Call(method, path, f"body {loc}: {what}", path_params=dict(base),
                               json=nested(loc, v))  # fmt: skip
            if "multipart/form-data" in content:
                form = deref(doc, content["multipart/form-data"]["schema"])
                for name, sub in form.get("properties", {}).items():
                    for what, v in bad_values(doc, sub):
                        if deref(doc, sub).get("format") != "binary":
                            yield Call(method, path, f"form {name}: {what}",
                                       path_params=dict(base), form={name: str(v)})  # fmt: skip


def raw_status(url: str, method: str, target: str, headers: dict[str, str]) -> int:
    """The status of a request sent byte for byte: HTTP clients refuse to send a control
    character in a header, and an attacker's does not."""
    parts = urlsplit(url)
    lines = [f"{method.upper()} {target} HTTP/1.1", f"Host: {parts.netloc}",
             "Content-Length: 0", "Connection: close",
             *(f"{k}: {v}" for k, v in headers.items())]  # fmt: skip
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = s.recv(64)
    return int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else 400


def send(service: Service, call: Call, upload: bytes) -> int:
    path = call.path
    for name, value in call.path_params.items():
        path = path.replace("{" + name + "}", quote(value, safe=""))
    key = service.admin_key if call.path.startswith("/quotas") else service.keys[0]
    headers = {"Authorization": f"Bearer {key}", **call.headers}
    if call.headers:
        query = "&".join(f"{k}={quote(v)}" for k, v in call.params.items())
        return raw_status(service.url, call.method, path + (f"?{query}" if query else ""),
                          headers)  # fmt: skip
    files = None
    if call.json is not None:  # escaped as JSON spells it: a lone surrogate has no UTF-8
        headers["Content-Type"] = "application/json"
    if call.form is not None:  # with a valid file, so that the field reaches the database
        files = {"file": ("set.npz", upload, "application/octet-stream")}
    r = httpx.request(
        call.method,
        f"{service.url}{path}",
        params=call.params,
        headers=headers,
        content=None if call.json is None else json.dumps(call.json).encode(),
        data=call.form,
        files=files,
        timeout=60,
    )
    return r.status_code


@pytest.mark.slow  # some 130 requests
def test_no_nul_or_huge_number_is_a_server_error(service: Service) -> None:
    doc = httpx.get(f"{service.url}/openapi.json", timeout=30).json()
    upload = npz_upload()
    walked = list(calls(doc))
    failures = [
        f"{c.method.upper()} {c.path} {c.what}: {status}"
        for c in walked
        if (status := send(service, c, upload)) >= 500
    ]
    assert len(walked) > 50, "the walk found too few fields: the OpenAPI changed shape?"
    assert not failures, "\n".join(failures)
    service.cancel_unfinished()


def test_a_control_character_in_a_name_is_a_422_that_says_so(service: Service) -> None:
    r = httpx.post(
        f"{service.url}/datasets",
        headers={"Authorization": f"Bearer {service.keys[0]}"},
        files={"file": ("set.npz", npz_upload(), "application/octet-stream")},
        data={"name": "digits\n"},
        timeout=60,
    )
    assert r.status_code == 422, r.text
    [e] = r.json()["detail"]
    assert e["loc"] == ["body", "name"] and e["msg"] == PLAIN_MESSAGE

"""Bad input gets a clear 4xx naming the problem, never a 500."""

from __future__ import annotations

import re
import socket
import time
import uuid

import httpx
import pytest

from api.auth import is_public
from core.worker_stats import WORKERS_KEY
from tests.service import Service


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def alice_job(service: Service) -> str:
    return str(service.client().submit({"epochs": 1, "max_steps": 2})["id"])


def test_every_route_but_health_needs_a_key(service: Service, alice_job: str) -> None:
    assert httpx.get(f"{service.url}/health").status_code == 200
    for method, path in [
        ("GET", "/jobs"),
        ("POST", "/jobs"),
        ("GET", f"/jobs/{alice_job}"),
        ("GET", f"/jobs/{alice_job}/metrics"),
        ("GET", f"/jobs/{alice_job}/events"),
        ("POST", f"/jobs/{alice_job}/cancel"),
        ("GET", f"/jobs/{alice_job}/model"),
        ("GET", f"/jobs/{alice_job}/record"),
    ]:
        for headers in ({}, auth("wrong"), {"Authorization": "Basic eDp5"}):
            r = httpx.request(method, f"{service.url}{path}", headers=headers, json={})
            assert r.status_code == 401, (method, path, headers, r.text)
            assert "Bearer" in r.headers["www-authenticate"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"lr": -1}, "lr"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 10**9}, "batch_size"),
        ({"dataset": "imagenet"}, "dataset"),
        ({"epochs": 1, "unknown": 1}, "unknown"),
    ],
)
def test_invalid_spec_is_422_naming_the_field(service: Service, body: dict, field: str) -> None:
    r = httpx.post(f"{service.url}/jobs", json=body, headers=auth(service.keys[0]))
    assert r.status_code == 422
    assert ["body", field] in [e["loc"] for e in r.json()["detail"]]


def test_nan_and_malformed_json_are_422(service: Service) -> None:
    for raw in (b'{"lr": NaN}', b'{"lr": Infinity}', b'{"epochs": ', b"\xff\xfe"):
        r = httpx.post(
            f"{service.url}/jobs",
            content=raw,
            headers={**auth(service.keys[0]), "content-type": "application/json"},
        )
        assert r.status_code == 422, raw


def test_oversized_body_is_413(service: Service) -> None:
    r = httpx.post(
        f"{service.url}/jobs",
        content=b" " * (2 << 20),
        headers={**auth(service.keys[0]), "content-type": "application/json"},
    )
    assert r.status_code == 413


def test_unknown_job_is_404_and_bad_ids_are_422(service: Service) -> None:
    r = httpx.get(f"{service.url}/jobs/{uuid.uuid4()}", headers=auth(service.keys[0]))
    assert r.status_code == 404
    for bad in ("abc", "..%2F..%2Fetc%2Fpasswd", "1 OR 1=1"):
        r = httpx.get(f"{service.url}/jobs/{bad}", headers=auth(service.keys[0]))
        assert r.status_code in (404, 422), bad


def test_another_owners_job_is_404_but_admins_see_it(service: Service, alice_job: str) -> None:
    for path in ("", "/metrics", "/epochs", "/confusion", "/model", "/record"):
        r = httpx.get(f"{service.url}/jobs/{alice_job}{path}", headers=auth(service.keys[1]))
        assert r.status_code == 404, path
    r = httpx.post(f"{service.url}/jobs/{alice_job}/cancel", headers=auth(service.keys[1]))
    assert r.status_code == 404
    assert httpx.get(f"{service.url}/jobs/{alice_job}", headers=auth(service.admin_key)).is_success
    bob_ids = [j["id"] for j in service.client(service.keys[1]).jobs()]
    assert alice_job not in bob_ids


def test_model_before_success_is_409(service: Service) -> None:
    c = service.client()
    job = c.submit({"epochs": 30})
    r = httpx.get(f"{service.url}/jobs/{job['id']}/model", headers=auth(service.keys[0]))
    assert r.status_code == 409
    r = httpx.get(f"{service.url}/jobs/{job['id']}/record", headers=auth(service.keys[0]))
    assert r.status_code == 409
    c.cancel(job["id"])


def test_list_is_newest_first_with_cursors_and_a_status_filter(service: Service) -> None:
    c = service.client(service.keys[1])
    ids = [c.submit({"epochs": 1, "max_steps": 1})["id"] for _ in range(5)]
    listed = [j["id"] for j in c.jobs(limit=2)]
    assert listed[:5] == ids[::-1]
    assert len(listed) == len(set(listed))
    r = httpx.get(f"{service.url}/jobs", params={"limit": 500}, headers=auth(service.keys[1]))
    assert r.status_code == 422
    r = httpx.get(
        f"{service.url}/jobs", params={"cursor": "garbage"}, headers=auth(service.keys[1])
    )
    assert r.status_code == 422
    for job in c.jobs(status="queued"):
        assert job["status"] == "queued"


def test_chunked_body_over_the_limit_is_413(service: Service) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(40):
            yield b" " * 65536  # 2.5 MiB in all, with no Content-Length

    r = httpx.post(
        f"{service.url}/jobs",
        content=chunks(),
        headers={**auth(service.keys[0]), "content-type": "application/json"},
    )
    assert r.status_code == 413


def test_prometheus_metrics(service: Service, alice_job: str) -> None:
    assert httpx.get(f"{service.url}/metrics").status_code == 401
    assert httpx.get(f"{service.url}/jobs/{alice_job}", headers=auth(service.keys[0])).is_success
    r = httpx.get(f"{service.url}/metrics", headers=auth(service.keys[0]))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in (
        'trainq_jobs{status="queued"}',
        "trainq_queue_depth",
        "trainq_workers_alive 1.0",
        "trainq_api_request_seconds_bucket",
        'route="/jobs/{job_id}"',
    ):
        assert name in text, name
    assert alice_job not in text  # label values are route templates, never ids


def _latency_series(service: Service) -> set[str]:
    text = httpx.get(f"{service.url}/metrics", headers=auth(service.admin_key)).text
    return set(re.findall(r"^trainq_api_request_seconds_count(\{.*\})", text, re.M))


@pytest.mark.slow
def test_unauthenticated_junk_does_not_grow_the_metrics(service: Service) -> None:
    def junk(tag: str) -> None:
        for i in range(40):
            httpx.request(f"JUNK{tag}{i}", f"{service.url}/x{tag}{i}")
            httpx.request("GET", f"{service.url}/nothing/{tag}/{i}")
            httpx.request(f"BREW{tag}{i}", f"{service.url}/health")

    junk("a")
    series = _latency_series(service)
    junk("b")
    assert _latency_series(service) == series  # new junk, no new series
    labels = " ".join(series)
    assert "JUNK" not in labels and "BREW" not in labels and "nothing" not in labels
    methods = set(re.findall(r'method="([^"]*)"', labels))
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}
    assert 'method="other"' in labels and 'route="other"' in labels


def test_no_key_is_401_before_the_body_is_parsed(service: Service) -> None:
    for raw in (b'{"epochs": ', b"\xff\xfe", b'{"lr": NaN}'):
        r = httpx.post(
            f"{service.url}/jobs", content=raw, headers={"content-type": "application/json"}
        )
        assert r.status_code == 401, raw
    r = httpx.post(f"{service.url}/jobs", content=b"{", headers=auth(service.keys[0]))
    assert r.status_code == 422  # with a key the body is read, and found wanting


def test_an_upload_without_a_key_is_refused_before_its_body(service: Service) -> None:
    def framed(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    chunk = b"x" * (64 << 10)  # the file's bytes, sent for as long as the server reads them
    part = b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.npz"\r\n\r\n'
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        sock.sendall(
            b"POST /datasets HTTP/1.1\r\nHost: trainq\r\n"
            b"Content-Type: multipart/form-data; boundary=b\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + framed(part + chunk)
        )
        # The answer comes while the body is still open (a server that reads the body first
        # would wait here for the rest of it).
        assert sock.recv(4096).startswith(b"HTTP/1.1 401")
        # And the rest is not read: the server hangs up long before 256 MiB went through.
        with pytest.raises(OSError):
            for _ in range((256 << 20) // len(chunk)):
                sock.sendall(framed(chunk))


def test_public_pages_need_no_key_and_load_nothing_from_outside(service: Service) -> None:
    for path in ("/", "/static/app.js", "/openapi.json", "/docs", "/redoc"):
        assert httpx.get(f"{service.url}{path}").status_code == 200, path
    for page in ("/docs", "/redoc"):
        html = httpx.get(f"{service.url}{page}").text
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
        assert assets, page
        for url in assets:
            assert url.startswith("/"), (page, url)  # this origin, no CDN
            assert httpx.get(f"{service.url}{url}").status_code == 200, url


def test_health_names_workers_only_to_admins(service: Service) -> None:
    admin = httpx.get(f"{service.url}/health", headers=auth(service.admin_key)).json()
    names = [w["name"] for w in admin["workers"]]
    assert names and admin["workers_alive"] == len(names)
    for headers in ({}, auth(service.keys[0])):
        r = httpx.get(f"{service.url}/health", headers=headers)
        assert r.status_code == 200
        body = r.json()
        assert body["status"] == "ok" and body["workers_alive"] == len(names)
        assert body["workers"] is None
        for name in names:
            assert name not in r.text


def test_junk_worker_stats_in_redis_cost_their_series_not_the_scrape(service: Service) -> None:
    r = service.redis.client()
    r.zadd(WORKERS_KEY, {"junk-worker": time.time()})
    r.hset("trainq:worker-stats:junk-worker", mapping={"images_per_second": "abc"})
    try:
        got = httpx.get(f"{service.url}/metrics", headers=auth(service.admin_key))
        assert got.status_code == 200
        assert 'worker="junk-worker"' not in got.text
    finally:
        r.delete("trainq:worker-stats:junk-worker")
        r.zrem(WORKERS_KEY, "junk-worker")
        r.close()


JSON_HINT = "send a JSON object with Content-Type: application/json"


@pytest.mark.parametrize(
    ("raw", "content_type", "says"),
    [
        (b'{"epochs": 1}', None, "the body was not read as JSON (Content-Type: none)"),
        (
            b'{"epochs": 1}',
            "application/x-www-form-urlencoded",  # what `curl -d` sends
            "the body was not read as JSON (Content-Type: application/x-www-form-urlencoded)",
        ),
        (b'{"epochs": ', "application/json", "the body is not valid JSON"),
        (b"", "application/json", "the body is empty"),
        (b"[1, 2]", "application/json", "the body is JSON but not an object"),
    ],
)
def test_a_body_that_is_no_json_object_says_how_to_send_one(
    service: Service, raw: bytes, content_type: str | None, says: str
) -> None:
    headers = auth(service.keys[0])
    if content_type:
        headers["Content-Type"] = content_type
    for path in ("/jobs", "/sweeps"):
        r = httpx.post(f"{service.url}{path}", content=raw, headers=headers)
        assert r.status_code == 422, r.text
        (problem,) = r.json()["detail"]
        assert problem["msg"].startswith(says) and problem["msg"].endswith(JSON_HINT), problem


def test_a_misspelt_field_is_answered_with_the_one_meant(service: Service) -> None:
    r = httpx.post(f"{service.url}/jobs", json={"epoch": 1}, headers=auth(service.keys[0]))
    assert r.status_code == 422
    (problem,) = r.json()["detail"]
    assert problem["loc"] == ["body", "epoch"]
    assert problem["msg"] == "Extra inputs are not permitted; did you mean `epochs`?"
    sweep = {"base": {"epoch": 1}, "space": {"lr": {"choice": [0.1, 0.2]}}, "trails": 2}
    r = httpx.post(f"{service.url}/sweeps", json=sweep, headers=auth(service.keys[0]))
    assert r.status_code == 422
    said = {tuple(p["loc"]): p["msg"] for p in r.json()["detail"]}
    assert said[("body", "base", "epoch")].endswith("did you mean `epochs`?")
    assert said[("body", "trails")].endswith("did you mean `trials`?")


def test_no_message_carries_pydantics_prefix(service: Service) -> None:
    for body in ({"dataset": "ds:nothing"}, {"dataset": "imagenet"}, {"export": []}):
        r = httpx.post(f"{service.url}/jobs", json=body, headers=auth(service.keys[0]))
        assert r.status_code == 422, body
        assert "Value error, " not in r.text, r.text


def test_the_docs_can_authorize_every_route_that_needs_a_key(service: Service) -> None:
    spec = httpx.get(f"{service.url}/openapi.json").json()
    ((name, scheme),) = spec["components"]["securitySchemes"].items()
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            declared = operation.get("security", spec.get("security", []))
            wanted = [] if is_public(path) else [{name: []}]
            assert declared == wanted, (method, path)
    # What the docs' Authorize button then sends is the key the routes take.
    r = httpx.get(f"{service.url}/jobs", headers=auth(service.keys[0]))
    assert r.status_code == 200


LONE = r"\ud800"  # a lone surrogate, as JSON spells it: valid JSON, no valid UTF-8


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/jobs", f'{{"epochs": 1, "max_steps": 1, "dataset": "{LONE}"}}'),
        ("/jobs", f'{{"epochs": 1, "{LONE}x": 1}}'),
        ("/jobs", f'{{"epochs": "{LONE}"}}'),
        ("/jobs", f'{{"dataset": "ds:{LONE}"}}'),
        ("/sweeps", f'{{"base": {{"epochs": 1, "{LONE}": 1}}, "grid": {{"lr": [0.1]}}}}'),
        ("/sweeps", f'{{"{LONE}": {{"{LONE}": ["{LONE}"]}}}}'),
        ("/sweeps", f'{{"space": {{"{LONE}": {{"choice": [1]}}}}}}'),  # a map's key
    ],
)
def test_a_lone_surrogate_is_a_422_that_echoes_it_escaped(
    service: Service, path: str, raw: str
) -> None:
    r = httpx.post(
        f"{service.url}{path}",
        content=raw.encode(),
        headers={**auth(service.keys[0]), "content-type": "application/json"},
    )
    assert r.status_code == 422, r.text
    r.content.decode("utf-8")  # strict: the reply itself is valid UTF-8
    assert "\\ud800" in str(r.json()["detail"])


def test_a_data_set_name_of_invalid_utf8_is_a_422(service: Service) -> None:
    """A form's bytes that are no UTF-8 (a surrogate's, a C1 control's) are no name."""
    for name in (b"name-\xed\xa0\x80", b"name-\xc2\x85", b"\x9b31m"):
        r = httpx.post(
            f"{service.url}/datasets",
            headers=auth(service.keys[0]),
            files={"file": ("d.zip", b"PK\x05\x06" + b"\x00" * 18, "application/zip")},
            data={"name": name},  # type: ignore[dict-item]
        )
        assert r.status_code == 422, (name, r.text)
        assert ["body", "name"] in [e["loc"] for e in r.json()["detail"]], (name, r.text)
        r.content.decode("utf-8")


@pytest.mark.parametrize("key", [b"k\x85\xa0", b"k\x9b31m", b"k\xe2\x80\xae"])
def test_an_idempotency_key_with_a_c1_control_or_a_bidi_override_is_a_422(
    service: Service, key: bytes
) -> None:
    """A header's bytes read as Latin-1: 0x85 is NEL; UTF-8's U+202E reads as "â\x80®"."""
    r = httpx.post(
        f"{service.url}/jobs",
        json={"epochs": 1, "max_steps": 1},
        headers={**auth(service.keys[0]), "Idempotency-Key": key},  # type: ignore[dict-item]
    )
    assert r.status_code == 422, r.text
    assert ["header", "idempotency-key"] in [e["loc"] for e in r.json()["detail"]]


def test_a_422_does_not_echo_a_long_input_whole(service: Service) -> None:
    for name in ("x" * 200_000, "line\u2028" + "y" * 50_000):
        r = httpx.post(
            f"{service.url}/datasets",
            headers=auth(service.keys[0]),
            files={"file": ("a.npz", b"not read", "application/octet-stream")},
            data={"name": name},
        )
        assert r.status_code == 422, r.text[:300]
        [problem] = r.json()["detail"]
        assert problem["loc"] == ["body", "name"]
        assert len(r.content) < 2000, len(r.content)
        assert problem["input"].endswith(f"... ({len(name)} characters)")

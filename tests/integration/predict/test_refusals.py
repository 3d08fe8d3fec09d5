"""POST /jobs/{id}/predict refuses what it cannot take, naming the problem: malformed JSON
images and files (422), bodies over their caps (413, at little memory), other media types
(415); SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from functools import partial

import torch
from PIL import Image

from tests.integration.predict.calls import detail, png, predict, zeros
from tests.memory import peak_growth_mib
from tests.service import Service


def test_invalid_json_images_are_422_naming_the_problem(service: Service, job_id: str) -> None:
    short_rows = {"images": [[[0.0] * 27 for _ in range(28)]]}
    [e] = detail(predict(service, job_id, json=short_rows))
    assert e["loc"] == ["body", "images", 0, 0] and "27 values" in e["msg"]
    assert "1×28×28" in e["msg"]

    few_rows = {"images": [[[0.0] * 28 for _ in range(27)]]}
    [e] = detail(predict(service, job_id, json=few_rows))
    assert e["loc"] == ["body", "images", 0] and "27 rows" in e["msg"]

    [e] = detail(predict(service, job_id, json=zeros(1, c=3)))
    assert e["loc"] == ["body", "images", 0] and "3 channels" in e["msg"]

    body = zeros(2)
    body["images"][1] = [[0.5] * 28 for _ in range(28)]
    body["images"][1][3] = [*[0.5] * 5, 1.5, *[0.5] * 22]
    [e] = detail(predict(service, job_id, json=body))
    assert e["loc"] == ["body", "images", 1, 3, 5] and e["type"] == "less_than_equal"

    for bad in ("NaN", "Infinity", "-Infinity"):
        raw = json.dumps(zeros(1)).replace("0", bad, 1)
        r = predict(service, job_id, content=raw, headers={"Content-Type": "application/json"})
        [e] = detail(r)
        assert e["loc"] == ["body", "images", 0, 0, 0] and e["type"] == "finite_number"

    r = predict(service, job_id, json=zeros(257))
    [e] = detail(r)
    assert e["loc"] == ["body", "images"] and e["type"] == "too_long"
    assert len(r.content) < 2000  # the request is not echoed back

    for body in ({"images": []}, {"images": "x"}, {}, {"images": [[[0]]], "extra": 1}):
        assert detail(predict(service, job_id, json=body))
    r = predict(service, job_id, content=b"{", headers={"Content-Type": "application/json"})
    assert detail(r)[0]["type"] == "json_invalid"


def test_integers_past_a_float_are_422_naming_each(service: Service, job_id: str) -> None:
    """JSON integers have no bound: one of 401 digits cannot even become a float."""
    huge, negative = "9" * 401, "-" + "9" * 401
    body = json.dumps(zeros(2)).replace("0", huge, 1)
    body = body[::-1].replace("0", negative[::-1], 1)[::-1]  # the last pixel of image 1
    r = predict(service, job_id, content=body, headers={"Content-Type": "application/json"})
    first, last = detail(r)
    assert first["loc"] == ["body", "images", 0, 0, 0] and first["type"] == "less_than_equal"
    assert last["loc"] == ["body", "images", 1, 27, 27]
    assert last["type"] == "greater_than_equal"
    assert len(r.content) < 2000  # the numbers are not echoed back


def test_invalid_files_are_422_naming_the_file(
    service: Service, job_id: str, digits: tuple[torch.Tensor, torch.Tensor]
) -> None:
    good = ("files", ("good.png", png(digits[0][0, 0]), "image/png"))
    garbage = ("files", ("garbage.png", b"\x89PNG not really", "image/png"))
    [e] = detail(predict(service, job_id, files=[good, garbage]))
    assert e["loc"] == ["body", "files", 1] and "garbage.png" in e["msg"]

    gif = io.BytesIO()
    Image.new("L", (28, 28)).save(gif, format="GIF")
    [e] = detail(predict(service, job_id, files=[("files", ("a.gif", gif.getvalue()))]))
    assert "a.gif" in e["msg"] and "not a PNG or JPEG" in e["msg"]

    wide = io.BytesIO()
    Image.new("L", (4097, 1)).save(wide, format="PNG")
    [e] = detail(predict(service, job_id, files=[("files", ("wide.png", wide.getvalue()))]))
    assert "4097×1" in e["msg"] and "wide.png" in e["msg"]

    tiny = png(digits[0][0, 0])
    many = [("files", (f"d{i}.png", tiny, "image/png")) for i in range(33)]
    [e] = detail(predict(service, job_id, files=many))
    assert e["loc"] == ["body", "files"] and "32" in e["msg"]

    [e] = detail(predict(service, job_id, files=[("file", ("d.png", tiny, "image/png"))]))
    assert e["loc"] == ["body", "file"]
    [e] = detail(predict(service, job_id, files=[good], data={"invert": "perhaps"}))
    assert e["loc"] == ["body", "invert"]
    only_invert = (
        b'--xyz\r\nContent-Disposition: form-data; name="invert"\r\n\r\ntrue\r\n--xyz--\r\n'
    )
    r = predict(
        service,
        job_id,
        content=only_invert,
        headers={"Content-Type": "multipart/form-data; boundary=xyz"},
    )
    [e] = detail(r)
    assert e["loc"] == ["body", "files"] and "at least one" in e["msg"]


def test_size_limits_are_413(service: Service, job_id: str) -> None:
    big = [("files", ("big.png", b"\0" * ((1 << 20) + 1), "image/png"))]
    r = predict(service, job_id, files=big)
    assert r.status_code == 413, r.text

    def chunked() -> Iterator[bytes]:  # no Content-Length: the route counts as it reads
        yield b'{"images": ['
        row = b"[" + b",".join([b"0.5"] * 28) + b"]"
        image = b"[" + b",".join([row] * 28) + b"]"
        for i in range(2200):  # ~5.5 MB, past 256 images' worth of JSON
            yield (b"," if i else b"") + image
        yield b"]}"

    r = predict(service, job_id, content=chunked(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert "JSON body over" in r.json()["detail"]


def test_json_bodies_cost_no_more_memory_than_the_images_they_may_hold(
    service: Service, job_id: str
) -> None:
    """Bodies under the byte cap that would parse into far more objects than 256 images of
    1×28×28 (short numbers, empty arrays, 200,000 numbers out of range): 413 or a short
    422, and the API's peak memory stays near the body's size."""
    assert service.api is not None
    assert predict(service, job_id, json=zeros(1)).status_code == 200  # torch and model loaded
    cap = 256 * 28 * 28 * 24  # JSON_BYTES_PER_VALUE
    one_row = b'{"images": [[[' + b",".join([b"0"] * (cap // 2 - 20)) + b"]]]}"
    empty_rows = b'{"images": [[' + b",".join([b"[]"] * (cap // 3 - 20)) + b"]]}"
    for body in (one_row, empty_rows):
        send = partial(
            predict, service, job_id, content=body, headers={"Content-Type": "application/json"}
        )
        r, growth = peak_growth_mib(service.api.pid, send)
        assert growth < 40, f"{growth} MiB for a {len(body)}-byte body"
        assert r.status_code == 413, r.text
        assert "256 images of 1×28×28" in r.json()["detail"]

    too_bright = {"images": [[[2] * 28 for _ in range(28)] for _ in range(256)]}
    r, growth = peak_growth_mib(service.api.pid, lambda: predict(service, job_id, json=too_bright))
    assert growth < 40, f"{growth} MiB for 200,704 values out of range"
    errors = detail(r)
    assert len(errors) == 20 and errors[0]["loc"] == ["body", "images", 0, 0, 0]
    assert {e["type"] for e in errors} == {"less_than_equal"}


def test_wrong_media_type_is_415(service: Service, job_id: str) -> None:
    r = predict(service, job_id, content=b"hello", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415, r.text


def test_a_body_of_200000_keys_is_a_short_422_at_little_cost(service: Service, job_id: str) -> None:
    """A body that is structurally wrong (200,000 keys where one, `images`, is allowed) is
    refused before any per-key work: at most 20 errors, and the API's peak memory stays
    near the body's size."""
    assert service.api is not None
    assert predict(service, job_id, json=zeros(1)).status_code == 200  # torch and model loaded
    keys = b",".join(b'"k%06d":0' % i for i in range(200_000))
    for body, n in (
        (b"{" + keys + b"}", 200_000),
        (b'{"images": [[[0]]], ' + keys + b"}", 200_001),
    ):
        send = partial(
            predict, service, job_id, content=body, headers={"Content-Type": "application/json"}
        )
        r, growth = peak_growth_mib(service.api.pid, send)
        assert growth < 16, f"{growth} MiB for a {len(body)}-byte body of 200,000 keys"
        errors = detail(r)
        assert 1 <= len(errors) <= 20 and len(r.content) < 4000
        assert errors[0]["loc"] == ["body"] and f"{n} keys" in errors[0]["msg"], errors


def test_a_lone_surrogate_in_json_images_is_a_422(service: Service, job_id: str) -> None:
    """A key or a value of JSON `\\ud800` is valid JSON but no UTF-8: echoed escaped."""
    body = zeros(1)
    body["images"][0][0][0] = "pixel"
    in_a_pixel = json.dumps(body).replace('"pixel"', r'"\ud800"')
    json_type = {"Content-Type": "application/json"}
    for raw in (r'{"images": "\udfff"}', in_a_pixel):
        r = predict(service, job_id, content=raw, headers=json_type)
        assert r.status_code == 422, r.text
        r.content.decode("utf-8")  # strict: the reply itself is valid UTF-8
    r = predict(service, job_id, content=r'{"images": [[[0]]], "\ud800": 1}', headers=json_type)
    assert ["body", "\\ud800"] in [e["loc"] for e in detail(r)]

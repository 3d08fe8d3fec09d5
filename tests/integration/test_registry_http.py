"""The model registry over HTTP (the API under uvicorn, a CPU worker that trains real jobs,
a redis-server; SQLite and PostgreSQL): register, promote and serve a model by alias
without knowing a job id; `@` in a path, as it is and as %40; another key's model reads as
a missing one, through an alias too; an admin's read-only share; a registered job kept from
DELETE; two promotions at once; bad input a 4xx naming the field, with nothing written."""

from __future__ import annotations

import hashlib
import io
import itertools
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from core.owners import owner_id
from core.train.data import load_dataset
from tests.cli_runs import run_trainq
from tests.service import Service, trained, wait_until

# A small net, so that an epoch of mnist-sample takes moments on a busy CPU.
TINY = {
    "conv1_channels": 4,
    "conv2_channels": 4,
    "conv3_channels": 0,
    "hidden": 8,
    "augment": "none",
    "ema_decay": None,
    "batch_size": 256,
    "epochs": 1,
    "max_steps": 3,
}
TIMEOUT = 120  # the first prediction imports torch into the API process


class Api:
    """Requests to the service with one key."""

    def __init__(self, service: Service, key: str) -> None:
        self.base, self.key = service.url, key

    def __call__(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.key}", **kw.pop("headers", {})}
        return httpx.request(method, f"{self.base}{path}", headers=headers, timeout=TIMEOUT, **kw)


@pytest.fixture(scope="module")
def alice(service: Service) -> Api:
    return Api(service, service.keys[0])


@pytest.fixture(scope="module")
def bob(service: Service) -> Api:
    return Api(service, service.keys[1])


@pytest.fixture(scope="module")
def admin(service: Service) -> Api:
    return Api(service, service.admin_key)


@pytest.fixture(scope="module")
def jobs(service: Service) -> list[dict[str, Any]]:
    """Two succeeded jobs of alice's: one with TorchScript and ONNX, one TorchScript."""
    c = service.client()
    first = trained(c, {**TINY, "export": ["torchscript", "onnx"]})
    return [first, trained(c, {**TINY, "export": ["torchscript"], "seed": 1})]


@pytest.fixture(scope="module")
def digits(data_dir: Path) -> list[bytes]:
    """Four real held-out digits as PNG files."""
    test = load_dataset("mnist-sample", data_dir).test
    files = []
    for i in range(4):
        buf = io.BytesIO()
        Image.fromarray(test.images[i, 0].numpy()).save(buf, format="PNG")
        files.append(buf.getvalue())
    return files


def name() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json() if r.content else None


def register(api: Api, model: str, job_id: str, status: int = 201, **params: str) -> Any:
    return ok(api("POST", f"/models/{model}/versions", json={"job_id": job_id}, params=params),
              status)  # fmt: skip


def promote(api: Api, model: str, alias: str, version: int, **body: Any) -> httpx.Response:
    return api("PUT", f"/models/{model}/aliases/{alias}", json={"version": version, **body})


def files(pngs: list[bytes]) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("files", (f"d{i}.png", b, "image/png")) for i, b in enumerate(pngs)]


def test_a_service_follows_an_alias_through_a_retrain(
    alice: Api, jobs: list[dict[str, Any]], digits: list[bytes]
) -> None:
    m = name()
    first = register(alice, m, jobs[0]["id"])
    assert (first["version"], first["job_id"], first["aliases"]) == (1, jobs[0]["id"], [])
    lineage = first["lineage"]
    record = ok(alice("GET", f"/jobs/{jobs[0]['id']}/record"))
    assert lineage["dataset"] == "mnist-sample"
    assert lineage["dataset_sha256"] == record["dataset"]["sha256"]
    assert lineage["metrics"] == jobs[0]["result"] and lineage["spec"] == jobs[0]["spec"]
    assert lineage["classes"] == record["dataset"]["classes"]
    assert [f["format"] for f in lineage["formats"]] == ["torchscript", "onnx"]
    assert register(alice, m, jobs[0]["id"], 200)["version"] == 1  # again: the same version
    assert register(alice, m, jobs[1]["id"])["version"] == 2
    assert ok(promote(alice, m, "production", 1, expected_version=0))["previous_version"] is None

    # The alias as it is and as %40: the same route.
    for path in (f"/models/{m}@production", f"/models/{m}%40production"):
        assert ok(alice("GET", path))["version"] == 1, path
    got = alice("GET", f"/models/{m}@production/model")
    assert got.status_code == 200, got.text
    assert got.headers["x-model-version"] == "1"
    assert f'filename="{m}-v1.pt"' in got.headers["content-disposition"]
    sha = hashlib.sha256(got.content).hexdigest()
    assert sha == lineage["formats"][0]["sha256"] and got.headers["etag"] == f'"{sha}"'
    same = alice("GET", f"/models/{m}@production/model", headers={"If-None-Match": f'"{sha}"'})
    assert same.status_code == 304
    answer = ok(alice("POST", f"/models/{m}@production/predict", files=files(digits)))
    assert (answer["model"], answer["version"], answer["job_id"]) == (m, 1, jobs[0]["id"])
    assert answer["model_format"] == "onnx" and len(answer["predictions"]) == 4

    # A retrain promoted: the same requests now get version 2.
    moved = ok(promote(alice, m, "production", 2, expected_version=1))
    assert (moved["previous_version"], moved["version"], moved["moved"]) == (1, 2, True)
    after = alice("GET", f"/models/{m}@production/model", headers={"If-None-Match": f'"{sha}"'})
    assert after.status_code == 200 and after.headers["x-model-version"] == "2"
    assert hashlib.sha256(after.content).hexdigest() != sha
    answer = ok(alice("POST", f"/models/{m}@production/predict", files=files(digits)))
    assert (answer["version"], answer["job_id"]) == (2, jobs[1]["id"])
    assert ok(alice("GET", f"/models/{m}@latest"))["version"] == 2
    by_number = ok(alice("POST", f"/models/{m}/versions/1/predict", files=files(digits)))
    assert by_number["version"] == 1

    # A promotion that expected where the alias no longer is changes nothing.
    stale = promote(alice, m, "production", 1, expected_version=1)
    assert stale.status_code == 409 and "points at version 2" in stale.json()["detail"]
    alias = ok(alice("GET", f"/models/{m}/aliases/production"))
    assert alias["version"] == 2
    moves = [(h["from_version"], h["to_version"], h["moved_by"]) for h in alias["history"]]
    me = owner_id(alice.key)
    assert moves == [(1, 2, me), (None, 1, me)]
    model = ok(alice("GET", f"/models/{m}"))
    assert [v["version"] for v in model["versions"]] == [2, 1]
    assert model["versions"][0]["aliases"] == ["production"]
    listed = {x["name"]: x for x in ok(alice("GET", "/models", params={"limit": 200}))["items"]}
    assert listed[m]["latest_version"] == 2 and listed[m]["aliases"][0]["alias"] == "production"


def every_route(m: str, params: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
    """Each /models route that names the model `m`, with a valid body where it takes one."""
    reads = [
        ("GET", f"/models/{m}", {}),
        ("GET", f"/models/{m}@production", {}),
        ("GET", f"/models/{m}%40production", {}),
        ("GET", f"/models/{m}@production/model", {}),
        ("HEAD", f"/models/{m}@production/model", {}),
        ("GET", f"/models/{m}@latest", {}),
        ("GET", f"/models/{m}/versions/1", {}),
        ("GET", f"/models/{m}/versions/1/model", {}),
        ("GET", f"/models/{m}/aliases/production", {}),
        ("POST", f"/models/{m}@production/predict", {"json": {"images": [[[0.0] * 28] * 28]}}),
        ("POST", f"/models/{m}/versions/1/predict", {"json": {"images": [[[0.0] * 28] * 28]}}),
    ]
    writes = [
        ("PUT", f"/models/{m}/aliases/production", {"json": {"version": 1}}),
        ("DELETE", f"/models/{m}/aliases/production", {}),
        ("DELETE", f"/models/{m}/versions/1", {}),
        ("DELETE", f"/models/{m}", {}),
        ("GET", f"/models/{m}/shares", {}),
    ]
    return [(method, path, {**kw, "params": params}) for method, path, kw in reads + writes]


def test_another_keys_model_reads_exactly_as_a_missing_one(
    alice: Api, bob: Api, jobs: list[dict[str, Any]]
) -> None:
    """Bob names alice's model by its owner, through every route: each answer is the one
    a model that does not exist gets, and nothing changes."""
    m = name()
    register(alice, m, jobs[0]["id"])
    ok(promote(alice, m, "production", 1))
    theirs = {"owner": owner_id(alice.key)}
    for method, path, kw in every_route(m, theirs):
        seen = bob(method, path, **kw)
        missing = bob(method, path.replace(m, "no-such-model"), **kw)
        assert seen.status_code == missing.status_code == 404, (method, path, seen.text)
        if method != "HEAD":
            assert seen.json()["detail"] == missing.json()["detail"].replace("no-such-model", m)
    # Not under bob's own name either, nor listed; and bob cannot register alice's job.
    assert bob("GET", f"/models/{m}@production").status_code == 404
    assert m not in {x["name"] for x in ok(bob("GET", "/models"))["items"]}
    stolen = bob("POST", f"/models/{m}/versions", json={"job_id": jobs[0]["id"]})
    assert stolen.status_code == 404 and "no job" in stolen.json()["detail"]
    assert ok(alice("GET", f"/models/{m}@production"))["version"] == 1
    assert ok(alice("GET", f"/models/{m}"))["version_count"] == 1


def test_an_admin_shares_a_model_read_only(
    alice: Api, bob: Api, admin: Api, jobs: list[dict[str, Any]], digits: list[bytes]
) -> None:
    m = name()
    register(alice, m, jobs[0]["id"])
    ok(promote(alice, m, "production", 1))
    theirs = {"owner": owner_id(alice.key)}
    reader = owner_id(bob.key)
    assert alice("PUT", f"/models/{m}/shares/{reader}").status_code == 403  # admins only
    shares = ok(admin("PUT", f"/models/{m}/shares/{reader}", params=theirs))
    assert [s["reader"] for s in shares] == [reader]

    listed = {x["name"]: x for x in ok(bob("GET", "/models", params={"limit": 200}))["items"]}
    assert listed[m]["read_only"] and listed[m]["owner"] == theirs["owner"]
    assert listed[m]["links"]["self"] == f"/models/{m}?owner={theirs['owner']}"
    assert ok(bob("GET", f"/models/{m}@production", params=theirs))["version"] == 1
    model = bob("GET", f"/models/{m}@production/model", params=theirs)
    assert model.status_code == 200 and model.headers["x-model-version"] == "1"
    answer = ok(bob("POST", f"/models/{m}@production/predict", params=theirs,
                    files=files(digits)))  # fmt: skip
    assert answer["version"] == 1
    # Never a write, nor who else reads it.
    for method, path, kw in every_route(m, theirs):
        if method in ("PUT", "DELETE") or path.endswith("/shares"):
            assert bob(method, path, **kw).status_code == 403, (method, path)
    refused = bob("POST", f"/models/{m}/versions", params=theirs, json={"job_id": jobs[1]["id"]})
    assert refused.status_code == 404  # bob's job list does not hold alice's job
    assert ok(alice("GET", f"/models/{m}@production"))["version"] == 1

    assert admin("DELETE", f"/models/{m}/shares/{reader}", params=theirs).status_code == 204
    assert bob("GET", f"/models/{m}@production", params=theirs).status_code == 404


def test_a_registered_job_is_kept_until_its_version_goes(
    service: Service, alice: Api, admin: Api
) -> None:
    job = trained(service.client(), {**TINY, "export": ["torchscript"], "seed": 2})
    m = name()
    register(alice, m, job["id"])
    ok(promote(alice, m, "staging", 1))
    for api in (alice, admin):
        refused = api("DELETE", f"/jobs/{job['id']}")
        assert refused.status_code == 409, refused.text
        assert f"version 1 of model {m}" in refused.json()["detail"]
    assert ok(alice("GET", f"/jobs/{job['id']}"))["formats"] == ["torchscript"]
    assert alice("GET", f"/models/{m}@staging/model").status_code == 200

    in_use = alice("DELETE", f"/models/{m}/versions/1")
    assert in_use.status_code == 409 and "staging" in in_use.json()["detail"]
    assert alice("DELETE", f"/models/{m}").status_code == 409  # an alias exists
    assert alice("DELETE", f"/models/{m}/aliases/staging").status_code == 204
    assert alice("DELETE", f"/models/{m}/versions/1").status_code == 204
    assert alice("DELETE", f"/jobs/{job['id']}").status_code == 204
    assert alice("DELETE", f"/models/{m}").status_code == 204
    assert alice("GET", f"/models/{m}").status_code == 404


def at_once(*calls: Callable[[], httpx.Response]) -> list[httpx.Response]:
    answers: list[Any] = [None] * len(calls)
    go = threading.Barrier(len(calls))

    def run(i: int) -> None:
        go.wait()
        answers[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_two_promotions_at_once_one_wins_the_other_is_409(
    alice: Api, jobs: list[dict[str, Any]]
) -> None:
    m = name()
    for job in jobs:
        register(alice, m, job["id"])
    for _ in range(10):
        ok(promote(alice, m, "production", 1))
        answers = at_once(
            lambda: promote(alice, m, "production", 2, expected_version=1),
            lambda: promote(alice, m, "production", 2, expected_version=1),
        )
        codes = sorted(a.status_code for a in answers)
        assert codes == [200, 409], [a.text for a in answers]
    history = ok(alice("GET", f"/models/{m}/aliases/production", params={"limit": 1000}))
    chain = list(reversed(history["history"]))
    assert all(b["from_version"] == a["to_version"] for a, b in itertools.pairwise(chain))


def test_bad_input_is_a_4xx_naming_the_field_and_writes_nothing(
    service: Service, alice: Api, jobs: list[dict[str, Any]]
) -> None:
    job = jobs[0]["id"]
    for bad in ("Digits", "a" * 65, "-x", "a b", "a%40b", "a%00b"):
        r = alice("POST", f"/models/{bad}/versions", json={"job_id": job})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["detail"][0]["loc"] == ["path", "name"], r.text
    m = name()
    for body in ({}, {"job_id": "nope"}, {"job_id": job, "extra": 1}):
        r = alice("POST", f"/models/{m}/versions", json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][0] == "body", r.text
    assert (
        alice("POST", f"/models/{m}/versions", json={"job_id": str(uuid.uuid4())}).status_code
        == 404
    )

    c = service.client()
    queued = c.submit({**TINY, "epochs": 50, "max_steps": None})
    c.cancel(queued["id"])
    wait_until(lambda: c.job(queued["id"])["status"] == "canceled", 60, "the cancel")
    r = alice("POST", f"/models/{m}/versions", json={"job_id": queued["id"]})
    assert r.status_code == 409 and "only a succeeded job" in r.json()["detail"], r.text
    assert alice("GET", f"/models/{m}").status_code == 404  # no model was made

    register(alice, m, job)
    unknown = promote(alice, m, "production", 9)
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["body", "version"]
    for alias in ("latest", "Prod", "1st", "a" * 65):
        assert promote(alice, m, alias, 1).status_code == 422, alias
    for body in ({"version": 0}, {"version": 1, "expected_version": -1}, {"version": "x"}):
        r = alice("PUT", f"/models/{m}/aliases/production", json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][0] == "body", r.text
    assert alice("GET", f"/models/{m}/aliases/production").status_code == 404  # never made
    assert alice("GET", f"/models/{m}/versions/2").status_code == 404
    assert alice("GET", f"/models/{m}@staging").status_code == 404
    assert alice("GET", f"/models/{m}/versions/0").status_code == 422
    assert (
        alice("GET", f"/models/{m}/versions/1/model", params={"format": "pt3"}).status_code == 422
    )
    assert (
        alice("GET", f"/models/{m}/versions/1/model", params={"format": "pt2"}).status_code == 409
    )
    assert alice("GET", "/models", params={"cursor": "bm9wZQ=="}).status_code == 422
    assert ok(alice("GET", f"/models/{m}"))["version_count"] == 1


def test_the_cli_registers_promotes_and_serves_by_alias(
    service: Service,
    jobs: list[dict[str, Any]],
    digits: list[bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"TRAINQ_API_URL": service.url, "TRAINQ_API_KEY": service.keys[0]}

    def trainq(*argv: str) -> Any:
        return run_trainq(capsys, monkeypatch, list(argv), env, tmp_path)

    m = name()
    ran = trainq("model", "register", jobs[0]["id"][:8], m)
    assert ran.returncode == 0 and f"{m} version 1" in ran.stdout, ran.stderr
    assert trainq("model", "register", jobs[1]["id"], m).returncode == 0
    ran = trainq("model", "alias", m, "production", "1", "--expect", "0")
    assert ran.returncode == 0 and "version 1 (new)" in ran.stdout, ran.stderr
    ran = trainq("model", "alias", m, "production", "2", "--expect", "0")
    assert ran.returncode == 1 and "points at version 1" in ran.stderr
    ran = trainq("model", "ls")
    assert ran.returncode == 0 and "production→1" in ran.stdout, ran.stdout
    ran = trainq("model", "ls", m)
    assert (
        ran.returncode == 0 and jobs[1]["id"][:8] in ran.stdout and "production → 1" in ran.stdout
    )

    ran = trainq("model", "download", f"{m}@production")
    assert ran.returncode == 0, ran.stderr
    saved = tmp_path / f"{m}-v1.pt"
    version = ok(Api(service, service.keys[0])("GET", f"/models/{m}/versions/1"))
    assert (
        hashlib.sha256(saved.read_bytes()).hexdigest() == version["lineage"]["formats"][0]["sha256"]
    )
    assert (
        trainq("model", "download", f"{m}/2", "--format", "torchscript", "-o", "two.pt").returncode
        == 0
    )
    assert (tmp_path / "two.pt").is_file()
    assert trainq("model", "download", m).returncode == 2  # neither @ALIAS nor /VERSION

    image = tmp_path / "digit.png"
    image.write_bytes(digits[0])
    ran = trainq("model", "predict", f"{m}@production", str(image), "--top", "2")
    assert ran.returncode == 0 and f"{m} version 1" in ran.stdout, ran.stderr
    assert f"{image}:" in ran.stdout

"""Names, tags and notes over real HTTP, on SQLite and PostgreSQL: at submission and by
PATCH, beside the spec and never in it; GET /jobs's filters, orders and cursors; every bad
value a 422 naming its field; another key's job answered as a missing one. The API alone
(no worker): the jobs stay queued, or are ended in the database by hand."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from client.http import ApiError, Client
from core.db import Database
from core.spec import JobStatus
from core.store import claim_job, end_job, succeed_job
from tests.service import RedisServer, Service

SMALL = {"epochs": 1, "max_steps": 1}


@pytest.fixture(scope="module")
def api(
    service_data_dir: Path, database_url: str, redis_server: RedisServer, db: Database
) -> Iterator[Service]:
    svc = Service(data_dir=service_data_dir, database_url=database_url, redis=redis_server)
    yield svc.up(workers=0)
    svc.stop()


def post(
    api: Service, path: str, body: Any, key: str | None = None, **headers: str
) -> httpx.Response:
    auth = {"Authorization": f"Bearer {key or api.keys[0]}"}
    return httpx.post(f"{api.url}{path}", json=body, headers={**auth, **headers})


def get(api: Service, path: str, params: Any = None, key: str | None = None) -> httpx.Response:
    auth = {"Authorization": f"Bearer {key or api.keys[0]}"}
    return httpx.get(f"{api.url}{path}", params=params, headers=auth)


def locs(resp: httpx.Response) -> list[list[Any]]:
    assert resp.status_code == 422, resp.text
    return [e["loc"] for e in resp.json()["detail"]]


def test_a_job_is_named_tagged_and_annotated_beside_its_spec(api: Service) -> None:
    body = {**SMALL, "name": "  resnet baseline ", "tags": ["b", "a", "b"], "notes": "why:\n lr"}
    r = post(api, "/jobs", body)
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["name"], job["tags"], job["notes"]) == ("resnet baseline", ["b", "a"], "why:\n lr")
    assert not {"name", "tags", "notes"} & set(job["spec"])
    again = api.client().job(job["id"])
    assert (again["name"], again["tags"], again["notes"]) == (
        job["name"],
        job["tags"],
        job["notes"],
    )
    plain = api.client().submit(SMALL)
    assert (plain["name"], plain["tags"], plain["notes"]) == (None, [], None)


def test_the_same_spec_and_key_with_other_labels_is_the_first_job_unchanged(api: Service) -> None:
    c, key = api.client(), str(uuid.uuid4())
    first = c.submit(SMALL, key, name="first", tags=["x"])
    r = post(api, "/jobs", {**SMALL, "name": "second", "tags": ["y"]}, **{"Idempotency-Key": key})
    assert r.status_code == 200 and r.json()["id"] == first["id"]
    assert (r.json()["name"], r.json()["tags"]) == ("first", ["x"])
    with pytest.raises(ApiError) as refused:
        c.submit({**SMALL, "max_steps": 2}, key, name="first", tags=["x"])
    assert refused.value.status == 409


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"tags": [f"t{i}" for i in range(17)]}, ["body", "tags"]),
        ({"tags": ["a b"]}, ["body", "tags", 0]),
        ({"tags": ["x" * 65]}, ["body", "tags", 0]),
        ({"tags": [""]}, ["body", "tags", 0]),
        ({"name": "n" * 129}, ["body", "name"]),
        ({"name": "a\nb"}, ["body", "name"]),
        ({"notes": "x" * 4097}, ["body", "notes"]),
        ({"notes": "nul\x00"}, ["body", "notes"]),
        ({"nmae": "typo"}, ["body", "nmae"]),
    ],
)
def test_bad_labels_are_422_naming_the_field(api: Service, body: dict, loc: list) -> None:
    before = len(list(api.client().jobs(limit=200)))
    r = post(api, "/jobs", {**SMALL, **body})
    assert loc in locs(r)
    if body.get("nmae"):
        assert "did you mean `name`?" in r.text
    assert len(list(api.client().jobs(limit=200))) == before  # nothing half-written


def test_patch_renames_retags_and_annotates_a_job(api: Service) -> None:
    c = api.client()
    job = c.submit(SMALL, name="old", tags=["a", "b"], notes="n")
    spec = job["spec"]
    got = c.relabel(job["id"], name="new", add_tags=["c", "a"], remove_tags=["b", "zz"])
    assert (got["name"], got["tags"], got["notes"], got["spec"]) == ("new", ["a", "c"], "n", spec)
    got = c.relabel(job["id"], notes=None, tags=["z"])
    assert (got["name"], got["tags"], got["notes"]) == ("new", ["z"], None)
    got = c.relabel(job["id"], name="")
    assert got["name"] is None and c.job(job["id"])["tags"] == ["z"]
    assert [j["id"] for j in c.jobs(tags=["z"])] == [job["id"]]
    assert list(c.jobs(tags=["a"], id_prefix=job["id"][:8])) == []


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"add_tags": [f"t{i}" for i in range(16)]}, ["body", "add_tags"]),  # 1 + 16
        ({"tags": ["ok"], "add_tags": ["x"]}, ["body"]),
        ({"tags": None}, ["body", "tags"]),
        ({}, ["body"]),
        ({"spec": {"epochs": 3}}, ["body", "spec"]),
    ],
)
def test_a_bad_patch_is_422_and_changes_nothing(api: Service, body: dict, loc: list) -> None:
    c = api.client()
    job = c.submit(SMALL, name="kept", tags=["one"])
    r = httpx.patch(
        f"{api.url}/jobs/{job['id']}", json=body, headers={"Authorization": f"Bearer {api.keys[0]}"}
    )
    assert loc in locs(r)
    assert (c.job(job["id"])["name"], c.job(job["id"])["tags"]) == ("kept", ["one"])


def test_another_key_s_job_is_patched_by_no_one_but_an_admin(api: Service) -> None:
    job = api.client().submit(SMALL, name="alice's")
    with pytest.raises(ApiError) as refused:
        api.client(api.keys[1]).relabel(job["id"], name="bob's now")
    assert refused.value.status == 404
    with pytest.raises(ApiError) as missing:
        api.client(api.keys[1]).relabel(str(uuid.uuid4()), name="x")
    assert missing.value.status == 404 and refused.value.detail == f"no job {job['id']}"
    assert api.client().job(job["id"])["name"] == "alice's"
    assert api.client(api.admin_key).relabel(job["id"], add_tags=["seen"])["tags"] == ["seen"]


def test_two_taggings_at_once_both_hold(api: Service) -> None:
    job = api.client().submit(SMALL)
    tags = [f"t{i}" for i in range(12)]
    clients = [Client(api.url, api.keys[0]) for _ in tags]
    threads = [
        threading.Thread(target=c.relabel, args=(job["id"],), kwargs={"add_tags": [t]})
        for c, t in zip(clients, tags, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    assert sorted(api.client().job(job["id"])["tags"]) == sorted(tags)
    assert [j["id"] for j in api.client().jobs(tags=["t3", "t11"])] == [job["id"]]


def test_a_sweep_s_trials_start_with_its_tags_and_are_named_after_it(api: Service) -> None:
    c = api.client()
    body = {
        "base": SMALL,
        "space": {"lr": {"log_uniform": [1e-4, 1e-2]}},
        "trials": 3,
        "parallel": 2,
    }
    sweep = c.create_sweep(body, name="lr search", tags=["exp-9"], notes="first try")
    assert (sweep["name"], sweep["tags"], sweep["notes"]) == ("lr search", ["exp-9"], "first try")
    trials = list(c.jobs(tags=["exp-9"]))
    assert len(trials) == 2 and all(j["sweep"]["id"] == sweep["id"] for j in trials)
    assert sorted(j["name"] for j in trials) == ["lr search #0", "lr search #1"]
    assert all(j["notes"] is None for j in trials)
    changed = c.relabel_sweep(sweep["id"], name="renamed", add_tags=["done"])
    assert (changed["name"], changed["tags"]) == ("renamed", ["exp-9", "done"])
    assert {j["name"] for j in c.jobs(sweep_id=sweep["id"])} == {"lr search #0", "lr search #1"}
    assert [j["id"] for j in c.jobs(name="LR SEARCH #1")] == [
        j["id"] for j in trials if j["name"] == "lr search #1"
    ]
    with pytest.raises(ApiError) as refused:
        api.client(api.keys[1]).relabel_sweep(sweep["id"], name="x")
    assert refused.value.status == 404
    c.cancel_sweep(sweep["id"])


def _ended(db: Database, job_id: str, status: JobStatus, accuracy: float | None = None) -> None:
    with db.writer() as s:
        assert claim_job(s, job_id=job_id, worker="w", device="cpu") is not None
    with db.writer() as s:
        if status is JobStatus.succeeded:
            figures = {"test_loss": 0.1, "train_loss": 0.2, "images_per_second": 1.0}
            result = {"test_accuracy": accuracy, "duration_s": 2.0, "epochs": 1, "steps": 1}
            result |= figures
            assert succeed_job(s, job_id=job_id, attempt=1, result=result, record={}, models=[])
        else:
            assert end_job(s, job_id=job_id, status=status, attempt=1)


def test_get_jobs_filters_orders_and_pages_with_cursors(api: Service, db: Database) -> None:
    key = f"key-{uuid.uuid4().hex[:8]}"
    c = api.client()
    mine = c.submit(SMALL, name="probe", tags=[key])
    accuracies = [0.91, 0.95, 0.93, 0.95, 0.9]  # two ties
    done = [
        c.submit({**SMALL, "seed": i}, name=f"Acc {a}", tags=[key, "done"])
        for i, a in enumerate(accuracies)
    ]
    for job, a in zip(done, accuracies, strict=True):
        _ended(db, job["id"], JobStatus.succeeded, a)
    failed = c.submit({**SMALL, "model": "resnet18"}, tags=[key])
    _ended(db, failed["id"], JobStatus.failed)
    theirs = api.client(api.keys[1]).submit(SMALL, name="Acc 0.99", tags=[key, "done"])

    best = list(c.jobs(tags=[key], sort="-test_accuracy", limit=2))
    assert [j["result"]["test_accuracy"] for j in best] == sorted(accuracies, reverse=True)
    ties = [j["id"] for j in best if j["result"]["test_accuracy"] == 0.95]
    assert ties == sorted(ties, reverse=True)  # ties by id
    assert theirs["id"] not in [j["id"] for j in c.jobs(tags=[key])]
    assert [j["id"] for j in c.jobs(tags=[key], sort="created", limit=3)] == [
        mine["id"],
        *[j["id"] for j in done],
        failed["id"],
    ]
    assert {j["id"] for j in c.jobs(tags=[key], status=["failed", "queued"])} == {
        mine["id"],
        failed["id"],
    }
    assert [j["id"] for j in c.jobs(tags=[key], model="resnet18")] == [failed["id"]]
    assert [j["id"] for j in c.jobs(tags=[key], name="acc 0.93")] == [done[2]["id"]]
    worst = c.jobs(tags=[key, "done"], sort="test_accuracy", limit=1)
    assert next(worst)["id"] == done[4]["id"]
    created = c.job(done[2]["id"])["created_at"]
    after = [j["id"] for j in c.jobs(tags=[key], created_after=created, sort="created")]
    assert after == [done[2]["id"], done[3]["id"], done[4]["id"], failed["id"]]
    assert [j["id"] for j in c.jobs(tags=[key], created_before=created, sort="created")] == [
        mine["id"],
        done[0]["id"],
        done[1]["id"],
    ]
    assert theirs["id"] in [j["id"] for j in api.client(api.admin_key).jobs(tags=[key])]


def test_a_cursor_serves_only_its_own_listing(api: Service) -> None:
    key = f"key-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        api.client().submit(SMALL, tags=[key])
    first = get(api, "/jobs", {"tag": key, "limit": 1}).json()
    cursor = first["next"]
    assert get(api, "/jobs", {"tag": key, "limit": 2, "cursor": cursor}).status_code == 200
    for params in (
        {"tag": key, "cursor": cursor, "sort": "created"},
        {"tag": [key, "other"], "cursor": cursor},
        {"cursor": cursor},
        {"tag": key, "cursor": cursor, "status": "failed"},
        {"tag": key, "cursor": "garbage"},
        {"tag": key, "cursor": "eyJvIjoxfQ=="},  # {"o":1}
    ):
        r = get(api, "/jobs", params)
        assert ["query", "cursor"] in locs(r), params


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"sort": "accuracy"}, ["query", "sort"]),
        ({"sort": "--created"}, ["query", "sort"]),
        ({"status": "done"}, ["query", "status", 0]),
        ({"tag": "a b"}, ["query", "tag", 0]),
        ({"tag": [f"t{i}" for i in range(17)]}, ["query", "tag"]),
        ({"created_after": "yesterday"}, ["query", "created_after"]),
        ({"created_before": "2026-13-01"}, ["query", "created_before"]),
        ({"model": "vgg"}, ["query", "model"]),
        ({"sweep_id": "nope"}, ["query", "sweep_id"]),
        ({"name": "x" * 129}, ["query", "name"]),
        ({"name": "\x00"}, ["query", "name"]),
        ({"dataset": ""}, ["query", "dataset"]),
    ],
)
def test_a_bad_filter_is_422_naming_it(api: Service, params: dict, loc: list) -> None:
    assert loc in locs(get(api, "/jobs", params))


def test_every_filter_runs_within_the_caller_s_own_jobs(api: Service) -> None:
    tag = f"shared-{uuid.uuid4().hex[:6]}"
    api.client(api.keys[1]).submit(SMALL, name="bob", tags=[tag])
    assert list(api.client().jobs(tags=[tag])) == []
    assert list(api.client().jobs(name="bob", tags=[tag])) == []

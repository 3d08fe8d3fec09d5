"""Quotas over real processes: each limit refused with 429, its body and Retry-After; the
usage figures; admin overrides in force at once; concurrent submissions at a limit. The
module's service runs no worker, so that submitted jobs stay queued (the queue contract's
case uses the shared service, which has one). SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, text, update

from core.db import AttemptTime, Database, Job
from core.owners import owner_id
from core.queue import enqueue_job
from core.quotas import lock_owner
from core.spec import JobSpec, JobStatus
from core.store import claim_job, create_job, end_job
from core.train.data import load_dataset
from tests.service import REPO, RedisServer, Service, free_port, status_of, wait_until
from tests.uploads import npz_bytes

SPEC = {"epochs": 1, "max_steps": 5, "export": ["torchscript"]}
ADMIN = "key-admin"
PAIRS = 16  # of keys: one a test


@pytest.fixture(scope="module")
def svc(service_data_dir: Path, database_url: str, redis_server: RedisServer) -> Iterator[Service]:
    """The API alone: no worker takes the jobs, so they stay queued."""
    service = Service(
        data_dir=service_data_dir,
        database_url=database_url,
        redis=redis_server,
        tenant_keys=tuple(f"key-quota{i}" for i in range(2 * PAIRS)),
    )
    yield service.up(workers=0)
    service.stop()


@pytest.fixture(scope="module")
def pairs(svc: Service) -> Iterator[tuple[str, str]]:
    return zip(svc.tenant_keys[::2], svc.tenant_keys[1::2], strict=True)


@pytest.fixture
def keys(pairs: Iterator[tuple[str, str]]) -> tuple[str, str]:
    """Two keys no other test uses: each test starts with no jobs, data sets or overrides."""
    return next(pairs)


@pytest.fixture(scope="module")
def db(database_url: str, svc: Service) -> Iterator[Database]:
    """The service's own database (migrated by it), to give jobs a past."""
    database = Database(database_url)
    yield database
    database.dispose()


def post_job(svc: Service, key: str, **headers: str) -> httpx.Response:
    return httpx.post(f"{svc.url}/jobs", json=SPEC, headers={**auth(key), **headers}, timeout=60)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def set_quota(svc: Service, owner: str, **limits: Any) -> dict[str, Any]:
    return svc.client(ADMIN).set_quota(owner, limits)


def usage(svc: Service, key: str) -> dict[str, Any]:
    figures: dict[str, Any] = svc.client(key).usage()["caller"]["usage"]
    return figures


def refusal(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 429, r.text
    body: dict[str, Any] = r.json()
    assert set(body) == {"detail", "limit", "value", "usage", "owner", "retry_after_s"}
    wait = body["retry_after_s"]
    assert r.headers.get("retry-after") == (None if wait is None else str(wait))
    return body


def test_past_max_queued_is_429_naming_the_limit(svc: Service, keys: tuple[str, str]) -> None:
    key, other = keys
    set_quota(svc, owner_id(key), max_queued=2)
    assert [post_job(svc, key).status_code for _ in range(2)] == [201, 201]
    body = refusal(post_job(svc, key))
    assert body["limit"] == "max_queued" and body["value"] == 2 and body["usage"] == 2
    assert body["owner"] == owner_id(key) and "cancel" in body["detail"]
    assert body["retry_after_s"] == 60  # no job of the key's has run: the plain guess
    assert usage(svc, key) == {
        "queued": 2,
        "running": 0,
        "dataset_bytes": 0,
        "train_hours_24h": 0.0,
    }
    # Another key has limits of its own, and an admin has none.
    assert post_job(svc, other).status_code == 201
    set_quota(svc, owner_id(ADMIN), max_queued=0)
    assert post_job(svc, ADMIN).status_code == 201


def test_a_replay_of_an_idempotency_key_is_never_refused(
    svc: Service, keys: tuple[str, str]
) -> None:
    key = keys[0]
    first = post_job(svc, key, **{"Idempotency-Key": "k1"})
    set_quota(svc, owner_id(key), max_queued=1)
    again = post_job(svc, key, **{"Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert refusal(post_job(svc, key, **{"Idempotency-Key": "k2"}))["limit"] == "max_queued"


def test_a_limit_of_zero_refuses_without_retry_after(svc: Service, keys: tuple[str, str]) -> None:
    key = keys[0]
    set_quota(svc, owner_id(key), max_queued=0)
    body = refusal(post_job(svc, key))
    assert body["retry_after_s"] is None and body["value"] == 0


def test_an_override_is_in_force_at_once_and_delete_restores_the_defaults(
    svc: Service, keys: tuple[str, str]
) -> None:
    key = keys[0]
    owner = owner_id(key)
    set_quota(svc, owner, max_queued=1)
    assert post_job(svc, key).status_code == 201
    refusal(post_job(svc, key))
    out = set_quota(svc, owner, max_queued=2, max_dataset_bytes=None)
    assert out["overrides"] == {"max_queued": 2, "max_dataset_bytes": None}
    assert out["limits"]["max_queued"] == 2 and out["limits"]["max_dataset_bytes"] is None
    assert post_job(svc, key).status_code == 201
    set_quota(svc, owner, max_queued=1)  # lowered below what is queued: refused again
    refusal(post_job(svc, key))
    admin = svc.client(ADMIN)
    assert owner in [q["owner"] for q in admin.quotas()["quotas"]]
    back = admin.clear_quota(owner)
    assert back["overrides"] == {} and back["limits"] == admin.quotas()["defaults"]
    assert back["limits"]["max_queued"] == 1000  # Settings' default
    assert post_job(svc, key).status_code == 201
    assert owner not in [q["owner"] for q in admin.quotas()["quotas"]]
    assert set_quota(svc, owner)["overrides"] == {}  # an empty body: the defaults, too
    assert owner not in [q["owner"] for q in admin.quotas()["quotas"]]


def test_only_an_admin_sets_or_reads_quotas(svc: Service, keys: tuple[str, str]) -> None:
    key, other = keys
    owner = owner_id(key)
    calls = [
        ("PUT", f"/quotas/{owner}", {"max_queued": 100}),
        ("PUT", f"/quotas/{owner_id(other)}", {"max_queued": 0}),
        ("DELETE", f"/quotas/{owner}", None),
        ("GET", "/quotas", None),
    ]
    for method, path, body in calls:
        r = httpx.request(method, f"{svc.url}{path}", json=body, headers=auth(key))
        assert r.status_code == 403 and "admin" in r.json()["detail"], (method, path, r.text)
    assert owner not in [q["owner"] for q in svc.client(ADMIN).quotas()["quotas"]]
    no_key = httpx.put(f"{svc.url}/quotas/{owner}", json={})
    assert no_key.status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        {"max_queued": -1},
        {"max_running": 0},
        {"max_train_hours_per_day": 0},
        {"queued": 3},
        {"max_queued": True},
        {"max_queued": 10**28},
        {"max_running": "2"},
        {"max_dataset_bytes": 1.5},
    ],
)
def test_an_invalid_limit_is_422(svc: Service, body: dict[str, Any]) -> None:
    r = httpx.put(f"{svc.url}/quotas/k_0000000000000001", json=body, headers=auth(ADMIN))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:1] == ["body"]


def test_an_owner_id_too_long_is_422(svc: Service) -> None:
    r = httpx.put(f"{svc.url}/quotas/{'k' * 65}", json={}, headers=auth(ADMIN))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "owner"]


def test_concurrent_overrides_of_a_new_owner_all_take(svc: Service) -> None:
    """Eight PUTs at once for an owner with no override yet: each is answered 200 (none meets
    another's insert as a 500), and one of the eight values is in force after."""
    owner = "k_" + uuid.uuid4().hex[:16]
    url = f"{svc.url}/quotas/{owner}"
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda n: httpx.put(url, json={"max_queued": n}, headers=auth(ADMIN)), range(8)
            )
        )
    assert [r.status_code for r in answers] == [200] * 8, [r.text[:200] for r in answers]
    final = httpx.get(f"{svc.url}/quotas", headers=auth(ADMIN)).json()
    assert any(owner in str(item) and "max_queued" in str(item) for item in [final])


@pytest.mark.slow
def test_concurrent_submissions_stop_exactly_at_the_limit(
    svc: Service, keys: tuple[str, str]
) -> None:
    """40 of one key's submissions at once against max_queued=5, through two API processes,
    with another key's among them: exactly 5 are created, and the other key's all are (a
    refusal fails no other submission of its batch). Then again with the limit raised to
    10: exactly 5 more."""
    key, other = keys
    second = dataclasses.replace(svc, port=free_port(), api=None, workers=[], clients=[])
    second.start_api()
    apis = [svc, second]
    sends = [key] * 40 + [other] * 5
    try:
        for limit in (5, 10):
            set_quota(svc, owner_id(key), max_queued=limit)
            with ThreadPoolExecutor(len(sends)) as pool:
                answers = list(pool.map(lambda i: post_job(apis[i % 2], sends[i]), range(45)))
            mine, others = answers[:40], answers[40:]
            codes = sorted(r.status_code for r in mine)
            assert codes == [201] * 5 + [429] * 35, [r.text[:200] for r in mine]
            assert [r.status_code for r in others] == [201] * 5
            assert {r.json()["usage"] for r in mine if r.status_code == 429} == {limit}
            assert usage(svc, key)["queued"] == limit
    finally:
        second.stop()


def test_one_batch_of_submissions_stops_exactly_at_the_limit(
    svc: Service, keys: tuple[str, str], db: Database
) -> None:
    """20 submissions that pile up while the database is held (SQLite: a write transaction;
    PostgreSQL: the owner's quota lock) are then written in one batch or two: a job
    planned earlier in a batch counts, so exactly 5 are created."""
    key = keys[0]
    owner = owner_id(key)
    set_quota(svc, owner, max_queued=5)
    with ThreadPoolExecutor(20) as pool:
        with db.writer() as s:
            lock_owner(s, owner)
            s.execute(select(1))  # SQLite: BEGIN IMMEDIATE, the one write lock
            answers = [pool.submit(post_job, svc, key) for _ in range(20)]
            time.sleep(1)  # for them to reach the API: a late one only makes a smaller batch
        codes = sorted(a.result().status_code for a in answers)
    assert codes == [201] * 5 + [429] * 15
    assert usage(svc, key)["queued"] == 5


def test_a_submission_waits_for_its_owners_lock_then_counts(
    svc: Service, keys: tuple[str, str], db: Database
) -> None:
    """PostgreSQL: while another transaction holds the owner's quota lock, with jobs it has
    not yet committed, a submission waits for it, then counts them."""
    if not svc.database_url.startswith("postgresql"):
        pytest.skip("SQLite serialises every writer: there is no lock of an owner's to wait for")
    key = keys[0]
    owner = owner_id(key)
    set_quota(svc, owner, max_queued=3)
    with ThreadPoolExecutor(1) as pool:
        with db.writer() as s:
            lock_owner(s, owner)
            for _ in range(3):
                create_job(s, job_id=str(uuid.uuid4()), spec=JobSpec(), owner=owner)
            answer = pool.submit(post_job, svc, key)
            wait_until(lambda: waiting_for_a_lock(db), 30, "the submission to wait for the lock")
        body = refusal(answer.result())
    assert body["usage"] == 3


def waiting_for_a_lock(db: Database) -> bool:
    with db.reader() as s:
        waiting = s.scalar(
            text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        )
    return bool(waiting)


def past(db: Database, owner: str, started_h_ago: float, ended_h_ago: float | None) -> str:
    """A job of `owner` that ran from `started_h_ago` hours ago until `ended_h_ago` (None:
    it still runs), as the store records it: claimed, ended, then moved back in time (its
    row and its attempt's time)."""
    job_id = str(uuid.uuid4())
    now = dt.datetime.now(dt.UTC)
    started = now - dt.timedelta(hours=started_h_ago)
    ended = None if ended_h_ago is None else now - dt.timedelta(hours=ended_h_ago)
    with db.writer() as s:
        create_job(s, job_id=job_id, spec=JobSpec.model_validate(SPEC), owner=owner)
        claim_job(s, job_id=job_id, worker="w", device="cpu")
        if ended is not None:
            end_job(s, job_id=job_id, status=JobStatus.succeeded)
        s.execute(update(Job).where(Job.id == job_id).values(started_at=started, finished_at=ended))
        s.execute(
            update(AttemptTime)
            .where(AttemptTime.job_id == job_id)
            .values(started_at=started, ended_at=ended)
        )
    return job_id


def test_training_hours_of_the_trailing_day(
    svc: Service, keys: tuple[str, str], db: Database
) -> None:
    key = keys[0]
    owner = owner_id(key)
    past(db, owner, 2, 1)  # one hour, ended an hour ago
    past(db, owner, 30, 23)  # seven hours, of which one is inside the trailing day
    past(db, owner, 50, 40)  # outside it
    assert usage(svc, key)["train_hours_24h"] == pytest.approx(2.0, abs=0.01)
    past(db, owner, 0.5, None)  # running: counted up to now
    figures = usage(svc, key)
    assert figures["train_hours_24h"] == pytest.approx(2.5, abs=0.01)
    assert figures["running"] == 1 and figures["queued"] == 0

    set_quota(svc, owner, max_train_hours_per_day=2.4)
    body = refusal(post_job(svc, key))
    assert body["limit"] == "max_train_hours_per_day" and body["value"] == 2.4
    assert body["usage"] == pytest.approx(2.5, abs=0.01)
    # Under 2.4 h once 0.1 h more of the 23-hour-old run has aged out: in 6 minutes (the
    # running job counted as if it stopped now).
    assert body["retry_after_s"] == pytest.approx(360, abs=30)
    set_quota(svc, owner, max_train_hours_per_day=3)
    assert post_job(svc, key).status_code == 201


@pytest.fixture(scope="module")
def digits(data_dir: Path) -> bytes:
    """An .npz of 300 + 100 real MNIST digits: a small, valid upload."""
    data = load_dataset("mnist-sample", data_dir)
    return npz_bytes(
        x_train=data.train.images[::8][:300, 0].numpy(),
        y_train=data.train.labels[::8][:300].numpy(),
        x_test=data.test.images[::4][:100, 0].numpy(),
        y_test=data.test.labels[::4][:100].numpy(),
    )


def upload(svc: Service, key: str, blob: bytes) -> httpx.Response:
    return httpx.post(
        f"{svc.url}/datasets",
        headers=auth(key),
        files={"file": ("digits.npz", blob, "application/octet-stream")},
        data={"name": "digits"},
        timeout=60,
    )


def test_past_max_dataset_bytes_is_429(svc: Service, keys: tuple[str, str], digits: bytes) -> None:
    key, other = keys
    owner = owner_id(key)
    first = upload(svc, key, digits)
    assert first.status_code == 201, first.text
    size = first.json()["size"]
    assert usage(svc, key)["dataset_bytes"] == size
    set_quota(svc, owner, max_dataset_bytes=2 * size - 1)
    body = refusal(upload(svc, key, digits))
    assert body["limit"] == "max_dataset_bytes" and body["value"] == 2 * size - 1
    assert body["usage"] == size and body["owner"] == owner and body["retry_after_s"] is None
    assert f"{size} more" in body["detail"]
    assert upload(svc, other, digits).status_code == 201  # another key's bytes are its own
    set_quota(svc, owner, max_dataset_bytes=2 * size)
    assert upload(svc, key, digits).status_code == 201
    assert usage(svc, key)["dataset_bytes"] == 2 * size


def test_a_key_with_no_room_left_is_refused_before_the_parse(
    svc: Service, keys: tuple[str, str]
) -> None:
    """Not a data set at all: a key with room gets 422 from the parse, one without 429."""
    key = keys[0]
    assert upload(svc, key, b"not an npz").status_code == 422
    set_quota(svc, owner_id(key), max_dataset_bytes=0)
    assert refusal(upload(svc, key, b"not an npz"))["limit"] == "max_dataset_bytes"


def test_an_admin_sees_every_owner(svc: Service, keys: tuple[str, str], digits: bytes) -> None:
    key, other = keys
    owner, other_owner, admin = owner_id(key), owner_id(other), owner_id(ADMIN)
    post_job(svc, key)
    assert upload(svc, other, digits).status_code == 201
    set_quota(svc, "k_0000000000000000", max_queued=7)  # an owner with only an override
    post_job(svc, ADMIN)
    report = svc.client(ADMIN).usage()
    lines = {line["owner"]: line for line in report["owners"]}
    assert {owner, other_owner, admin, "k_0000000000000000"} <= set(lines)
    assert lines[owner]["usage"]["queued"] == 1 and lines[other_owner]["usage"]["dataset_bytes"] > 0
    assert lines["k_0000000000000000"]["overridden"] == ["max_queued"]
    assert lines["k_0000000000000000"]["limits"]["max_queued"] == 7
    assert report["caller"] == lines[admin] and set(lines[admin]["limits"].values()) == {None}
    assert svc.client(key).usage()["owners"] == []


def test_trainq_usage_prints_the_table(svc: Service, keys: tuple[str, str]) -> None:
    key = keys[0]
    set_quota(svc, owner_id(key), max_queued=5)
    post_job(svc, key)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env.update(TRAINQ_API_URL=svc.url, TRAINQ_API_KEY=key)
    out = subprocess.run(
        [sys.executable, "-m", "cli", "usage"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    header, line = out.stdout.splitlines()
    assert header.split() == ["owner", "queued", "running", "data", "sets", "train", "h/24", "h"]
    assert line.split() == [owner_id(key), "(you)", "1/5", "0/-", "0", "B/10.0", "GiB", "0.00/-"]


def test_a_job_enqueued_straight_onto_the_queue_runs_past_a_limit_and_counts(
    service: Service,
) -> None:
    """Another service's job is never refused by a quota (the queue contract knows none),
    and counts in its owner's usage once a worker gives it its row. (The shared service:
    it has a worker.)"""
    key = service.keys[0]
    owner = owner_id(key)
    service.client(service.admin_key).set_quota(owner, {"max_queued": 0})
    job_id = str(uuid.uuid4())
    r = service.redis.client()
    enqueue_job(r, queue=service.queue, job_id=job_id, spec=SPEC, owner=owner, timeout_s=600)
    r.close()
    c = service.client(key)
    wait_until(lambda: status_of(c, job_id) == "succeeded", 180, "the job", interval=0.2)
    figures = c.usage()["caller"]["usage"]
    assert figures["train_hours_24h"] > 0 and figures["queued"] == 0
    refused = httpx.post(f"{service.url}/jobs", json=SPEC, headers=auth(key))
    assert refusal(refused)["limit"] == "max_queued"

"""End to end over real HTTP: submit, follow, poll, download; SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import torch

from client.http import ApiError
from core.train.data import load_dataset
from core.train.verify_export import load_torchscript
from tests.service import Service, wait_until


def all_metrics(service: Service, job_id: str, limit: int) -> tuple[list[dict], list[str]]:
    c = service.client()
    items: list[dict] = []
    statuses: list[str] = []
    after = 0
    while True:
        page = c.metrics(job_id, after=after, limit=limit)
        items += page["items"]
        statuses.append(page["status"])
        after = page["next"]
        if page["status"] in ("succeeded", "failed", "canceled") and not page["items"]:
            return items, statuses
        if len(page["items"]) < limit:
            time.sleep(0.2)  # caught up with the live stream: poll as a client would


@pytest.mark.slow
def test_submit_follow_poll_download(service: Service, data_dir: Path, tmp_path: Path) -> None:
    c = service.client()
    resp = httpx.post(
        f"{service.url}/jobs",
        json={"dataset": "mnist-sample", "epochs": 5},
        headers={"Authorization": f"Bearer {service.keys[0]}"},
    )
    assert resp.status_code == 201, resp.text
    job = resp.json()
    assert resp.headers["location"] == f"/jobs/{job['id']}"
    assert job["status"] == "queued" and job["links"]["model"] == f"/jobs/{job['id']}/model"

    polled: dict[str, tuple[list[dict], list[str]]] = {}
    poller = threading.Thread(target=lambda: polled.update(r=all_metrics(service, job["id"], 37)))
    poller.start()
    events = list(c.events(job["id"]))
    poller.join(timeout=120)

    # SSE: every step once, in order, epoch ends, and a final status.
    steps = [e["data"]["step"] for e in events if e["event"] == "step"]
    total = 5 * 63
    assert steps == list(range(1, total + 1))
    assert [e["data"]["epoch"] for e in events if e["event"] == "epoch"] == [1, 2, 3, 4, 5]
    assert events[-1]["event"] == "status" and events[-1]["data"]["status"] == "succeeded"
    assert [e["data"]["status"] for e in events if e["event"] == "status"] == [
        "running",
        "succeeded",
    ]

    # Cursor polling while it ran: the same steps exactly once, some of them live.
    items, statuses = polled["r"]
    assert [p["step"] for p in items] == list(range(1, total + 1))
    assert "running" in statuses
    assert all(p["memory_allocated"] == 0 for p in items)  # CPU worker
    # And after the end, from the database.
    again, _ = all_metrics(service, job["id"], 1000)
    assert again == items

    done = c.job(job["id"])
    assert done["status"] == "succeeded" and done["attempt"] == 1
    assert done["progress"] == {"step": total, "total_steps": total, "epoch": 5}
    assert done["worker"] is None and done["device"].startswith("cpu")  # a tenant's view
    assert service.client(service.admin_key).job(job["id"])["worker"]
    assert done["result"]["test_accuracy"] >= 0.97
    assert done["started_at"] and done["finished_at"]
    epochs = c.epochs(job["id"])
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4, 5]
    assert c.record(job["id"])["spec"]["epochs"] == 5

    head = httpx.head(
        f"{service.url}/jobs/{job['id']}/model",
        headers={"Authorization": f"Bearer {service.keys[0]}"},
    )
    assert head.status_code == 200 and int(head.headers["content-length"]) > 1000
    sha = c.download(job["id"], tmp_path / "model.pt").sha256
    assert head.headers["etag"] == f'"{sha}"'
    model = load_torchscript((tmp_path / "model.pt").read_bytes())
    test = load_dataset("mnist-sample", data_dir).test
    with torch.inference_mode():
        predicted = model(test.images.float() / 255).argmax(1)
    assert (predicted == test.labels).float().mean().item() >= 0.97


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_sse_resumes_from_last_event_id(service: Service) -> None:
    c = service.client()
    job = c.submit({"epochs": 1, "max_steps": 20, "batch_size": 32})
    first = list(c.events(job["id"]))
    cut = first[7]["id"]
    resumed = list(c.events(job["id"], last_event_id=cut))
    assert [e["id"] for e in resumed] == [e["id"] for e in first[8:]]


@pytest.mark.slow
def test_idempotency_key(service: Service) -> None:
    c = service.client()
    key = str(uuid.uuid4())
    a = c.submit({"epochs": 1, "max_steps": 2}, idempotency_key=key)
    b = c.submit({"epochs": 1, "max_steps": 2}, idempotency_key=key)
    assert a["id"] == b["id"]
    with pytest.raises(ApiError) as exc:
        c.submit({"epochs": 1, "max_steps": 3}, idempotency_key=key)
    assert exc.value.status == 409
    # Another owner may use the same key for its own job.
    other = service.client(service.keys[1]).submit({"epochs": 1, "max_steps": 2}, key)
    assert other["id"] != a["id"]
    wait_until(lambda: c.job(a["id"])["status"] == "succeeded", 60, "job to finish")


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_cancel_running_then_queued(service: Service) -> None:
    c = service.client()
    running = c.submit({"epochs": 50})
    queued = c.submit({"epochs": 1})
    wait_until(lambda: c.job(running["id"])["progress"]["step"] > 5, 60, "the job to train")
    assert c.job(queued["id"])["status"] == "queued"
    assert c.cancel(queued["id"])["status"] == "canceled"
    c.cancel(running["id"])
    wait_until(lambda: c.job(running["id"])["status"] == "canceled", 30, "the job to stop")
    stopped = c.job(running["id"])
    assert stopped["error"]["code"] == "canceled"
    assert stopped["progress"]["step"] < 50 * 63
    for job_id in (running["id"], queued["id"]):
        with pytest.raises(ApiError) as exc:
            c.cancel(job_id)
        assert exc.value.status == 409
    # The queued one never ran, not even after the worker became free.
    after = c.submit({"epochs": 1, "max_steps": 2})
    wait_until(lambda: c.job(after["id"])["status"] == "succeeded", 60, "a later job to run")
    never = c.job(queued["id"])
    assert never["status"] == "canceled" and never["attempt"] == 0 and never["started_at"] is None
    steps_of_stopped = c.metrics(running["id"], limit=5000)["items"]
    assert [p["step"] for p in steps_of_stopped] == list(range(1, len(steps_of_stopped) + 1))
    with pytest.raises(ApiError) as exc:
        c.download(running["id"], Path("/nonexistent/never-written.pt"))
    assert exc.value.status == 409


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_worker_names_reach_admin_keys_only(service: Service) -> None:
    """A worker's name carries its host's: an admin key sees it on the job, in the job list
    and in /metrics; the job's own key sees it nowhere, the event stream included."""
    c = service.client()
    job = c.submit({"epochs": 1, "max_steps": 3})
    events = list(c.events(job["id"]))
    admin = service.client(service.admin_key)
    worker = admin.job(job["id"])["worker"]
    assert worker and admin.job(job["id"])["status"] == "succeeded"
    assert worker in [j["worker"] for j in admin.jobs(limit=200)]
    admin_metrics = httpx.get(f"{service.url}/metrics", headers=auth(service.admin_key)).text
    assert f'trainq_worker_images_per_second{{worker="{worker}"}}' in admin_metrics

    mine = c.job(job["id"])
    assert mine["worker"] is None and mine["device"] and mine["attempt"] == 1
    assert all(j["worker"] is None for j in c.jobs(limit=200))
    [running] = [e["data"] for e in events if e["data"].get("status") == "running"]
    assert running["attempt"] == 1 and running["device"] == mine["device"]
    assert "worker" not in running
    for path in (f"/jobs/{job['id']}", "/jobs?limit=200", "/metrics"):
        r = httpx.get(f"{service.url}{path}", headers=auth(service.keys[0]))
        assert r.status_code == 200 and worker not in r.text, path
    tenant_metrics = httpx.get(f"{service.url}/metrics", headers=auth(service.keys[0])).text
    assert "trainq_workers_alive" in tenant_metrics and 'worker="' not in tenant_metrics
    assert worker not in str(events)


@pytest.mark.slow  # over 10 s: the full run, not --fast
def test_cursors_past_any_step_are_422_or_ignored_never_500(service: Service) -> None:
    """Steps are 32-bit integers in the database: a metrics cursor past 2**31 - 1 is a 422
    naming `after`, an SSE Last-Event-ID past any step is ignored (the stream starts from
    the beginning, as for any id it never sent); neither reaches the database (where
    PostgreSQL refused it, a 500 or a stream cut short)."""
    c = service.client()
    job = c.submit({"epochs": 1, "max_steps": 2})
    events = list(c.events(job["id"]))
    assert events[-1]["data"]["status"] == "succeeded"
    url = f"{service.url}/jobs/{job['id']}/metrics"
    r = httpx.get(url, params={"after": 2**31 - 1}, headers=auth(service.keys[0]))
    assert r.status_code == 200 and r.json()["items"] == [], r.text
    for after in (2**31, 2**53):
        r = httpx.get(url, params={"after": after}, headers=auth(service.keys[0]))
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["query", "after"]
    for far in ("2147483648-0", "999999999999999999-3"):
        assert list(c.events(job["id"], last_event_id=far)) == events, far


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}

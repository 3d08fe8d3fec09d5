"""`trainq serve --workers 2`: two API processes behind one port keep every guarantee of one.

Each test pins its HTTP connections to a chosen process: the kernel hands each new
connection to one of them, and /proc says which (the process holding the accepted socket),
so "through one process, then through the other" is what really happens."""

from __future__ import annotations

import http.client
import json
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from core.db import Database, Job
from tests.service import RedisServer, Service, descendants

PROCESSES = 2
SPEC = {"epochs": 1, "max_steps": 1, "export": ["torchscript"], "dataset": "mnist-sample"}


@pytest.fixture(scope="module")
def svc(
    service_data_dir: Path, database_url: str, redis_server: RedisServer, db: Database
) -> Iterator[Service]:
    """The API in two processes, with no worker: jobs stay queued until canceled."""
    service = Service(
        data_dir=service_data_dir,
        database_url=database_url,
        redis=redis_server,
        api_args=("--workers", str(PROCESSES)),
    )
    service.migrate()
    service.start_api()
    yield service
    service.stop()


class Pinned:
    """One keep-alive HTTP connection, and the API process that accepted it."""

    def __init__(self, svc: Service, key: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
        self.key = key
        self.request("GET", "/health")  # connects: the connection is accepted now
        self.pid = _accepted_by(svc, self.conn.sock.getsockname()[1])

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        sent = {"Authorization": f"Bearer {self.key}", **(headers or {})}
        data = None if body is None else json.dumps(body)
        if data is not None:
            sent["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=sent)
        answer = self.conn.getresponse()
        raw = answer.read()
        kind = answer.getheader("Content-Type") or ""
        return answer.status, json.loads(raw) if kind.startswith("application/json") else raw

    def close(self) -> None:
        self.conn.close()


def _accepted_by(svc: Service, client_port: int) -> int:
    """The API process holding the server side of the connection from `client_port`."""
    inode = _server_socket(svc.port, client_port)
    assert svc.api is not None
    for pid in descendants(svc.api.pid):
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if fd.readlink() == Path(f"socket:[{inode}]"):
                    return pid
            except OSError:
                continue
    raise AssertionError(f"no API process holds the connection from port {client_port}")


def _server_socket(server_port: int, client_port: int) -> str:
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == (
            client_port
        ):
            return fields[9]
    raise AssertionError(f"no accepted socket for the connection from port {client_port}")


@pytest.fixture
def pinned(svc: Service) -> Iterator[dict[int, list[Pinned]]]:
    """Connections grouped by the process that took them: two to each of the two."""
    by_pid: dict[int, list[Pinned]] = {}
    opened = []
    for _ in range(200):
        if len(by_pid) == PROCESSES and all(len(c) >= 2 for c in by_pid.values()):
            break
        c = Pinned(svc, svc.keys[0])
        opened.append(c)
        by_pid.setdefault(c.pid, []).append(c)
    assert len(by_pid) == PROCESSES, f"every connection went to {list(by_pid)}"
    yield by_pid
    for c in opened:
        c.close()


def _two(pinned: dict[int, list[Pinned]]) -> tuple[list[Pinned], list[Pinned]]:
    one, other = pinned.values()
    return one, other


@pytest.mark.slow
def test_one_idempotency_key_from_both_processes_at_once_makes_one_job(
    svc: Service, pinned: dict[int, list[Pinned]], db: Database
) -> None:
    one, other = _two(pinned)
    for _ in range(10):
        key = str(uuid.uuid4())
        answers = _at_once([one[0], other[0]], "POST", "/jobs", SPEC, {"Idempotency-Key": key})
        assert sorted(status for status, _ in answers) == [200, 201], answers
        assert len({body["id"] for _, body in answers}) == 1
        with db.reader() as s:
            count = s.scalar(select(func.count()).where(Job.idempotency_key == key))
        assert count == 1


def _at_once(conns: list[Pinned], *request: Any) -> list[tuple[int, Any]]:
    """The same request on each connection, sent at the same moment from threads."""
    answers: list[tuple[int, Any]] = []
    start = threading.Barrier(len(conns))

    def send(c: Pinned) -> None:
        start.wait()
        answers.append(c.request(*request))

    threads = [threading.Thread(target=send, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_a_job_from_one_process_is_seen_followed_and_canceled_through_the_other(
    svc: Service, pinned: dict[int, list[Pinned]]
) -> None:
    one, other = _two(pinned)
    status, job = one[0].request("POST", "/jobs", SPEC)
    assert status == 201
    path = f"/jobs/{job['id']}"
    status, seen = other[0].request("GET", path)
    assert (status, seen["status"]) == (200, "queued")
    followers = [_follow(c, path) for c in (other[0], one[0])]  # one in each process
    status, canceled = other[1].request("POST", f"{path}/cancel")
    assert (status, canceled["status"]) == (202, "canceled")
    for events in followers:
        last = events()
        assert last["status"] == "canceled", last
    status, seen = one[1].request("GET", path)
    assert seen["status"] == "canceled"


def _follow(c: Pinned, path: str) -> Any:
    """Opens the job's event stream on `c`; the returned call reads it to its end and gives
    the last event's data."""
    c.conn.request("GET", f"{path}/events", headers={"Authorization": f"Bearer {c.key}"})
    answer = c.conn.getresponse()
    assert answer.status == 200

    def events() -> dict[str, Any]:
        datas = re.findall(rb"^data: (.*)$", answer.read(), re.MULTILINE)
        return dict(json.loads(datas[-1]))

    return events


def test_prometheus_counts_the_requests_of_every_process(
    svc: Service, pinned: dict[int, list[Pinned]]
) -> None:
    one, other = _two(pinned)
    route = f"/jobs/{uuid.uuid4()}/epochs"  # a route no other test asks for: 404 each
    for c in (one[0], other[0]):
        for _ in range(5):
            assert c.request("GET", route)[0] == 404
    series = re.compile(
        rb'trainq_api_request_seconds_count\{method="GET",route="/jobs/\{job_id\}/epochs",'
        rb'status="404"\} ([0-9.]+)'
    )
    for c in (one[0], other[0]):
        status, text = c.request("GET", "/metrics")
        assert status == 200
        found = series.search(text)
        assert found is not None, text[:2000]
        assert float(found[1]) == 10
        assert b"trainq_jobs{" in text  # the service's own series are still there

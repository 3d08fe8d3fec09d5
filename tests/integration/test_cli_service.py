"""The service commands as a user runs them: `trainq serve` and `trainq worker` refuse a
database that is not at head, and `trainq up` with no keys makes one that sees every job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from client.http import Client
from core.queue import enqueue_job
from core.schema import upgrade
from tests.service import REPO, RedisServer, free_port, kill_group, status_of, wait_until

NOT_AT_HEAD = "run `trainq migrate` first"


def trainq_env(data_dir: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env.update(TRAINQ_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", **settings)
    return env


@pytest.mark.parametrize("revision", [None, "0003"], ids=["empty", "0003"])
@pytest.mark.parametrize("command", [["serve"], ["worker", "--gpus", "cpu"]], ids=lambda c: c[0])
def test_a_database_not_at_head_is_refused_at_once(
    tmp_path: Path, redis_server: RedisServer, command: list[str], revision: str | None
) -> None:
    url = f"sqlite:///{tmp_path / 'trainq.db'}"
    if revision is not None:
        upgrade(url, revision)
    env = trainq_env(
        tmp_path,
        TRAINQ_DATABASE_URL=url,
        TRAINQ_REDIS_URL=redis_server.url,
        TRAINQ_PORT=str(free_port()),
        TRAINQ_API_KEYS="a-key",
    )
    with (tmp_path / "out.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", *command],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        pytest.fail(f"`trainq {' '.join(command)}` did not stop on a database not at head")
    err = (tmp_path / "out.log").read_text()
    assert proc.returncode == 2, err
    assert f"the database is at revision {revision}, not " in err and NOT_AT_HEAD in err
    assert "SELECT" not in err  # a clear message, not a failing query's SQL


class Up(NamedTuple):
    url: str
    data_dir: Path
    queue: str


@pytest.fixture
def up(tmp_path: Path, data_dir: Path, redis_server: RedisServer) -> Iterator[Up]:
    """`trainq up` on a fresh data folder with no keys configured (a Redis of the test's, so
    that no embedded server outlives it)."""
    folder = tmp_path / "data"
    folder.mkdir()
    os.symlink(data_dir / "mnist-sample", folder / "mnist-sample")
    port = free_port()
    queue = f"trainq-up-{uuid.uuid4().hex[:8]}"
    env = trainq_env(
        folder, TRAINQ_REDIS_URL=redis_server.url, TRAINQ_PORT=str(port), TRAINQ_QUEUE=queue
    )
    with (tmp_path / "up.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "up", "--gpus", "cpu"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: workers_alive(url), 120, "`trainq up` to serve with a worker", 0.2)
        yield Up(url, folder, queue)
    finally:
        proc.send_signal(signal.SIGINT)  # as ^C: the API stops, then its workers
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise
        finally:
            print((tmp_path / "up.log").read_text()[-3000:])


def workers_alive(url: str) -> bool:
    try:
        return bool(httpx.get(f"{url}/health", timeout=2).json()["workers_alive"])
    except (httpx.HTTPError, ValueError, KeyError):
        return False


@pytest.mark.slow  # a job trained end to end: the full run, not --fast
def test_up_makes_a_key_that_sees_jobs_enqueued_without_an_owner(
    up: Up, redis_server: RedisServer
) -> None:
    key = (up.data_dir / "api_key").read_text().strip()
    assert key.startswith("tq_")
    job_id = str(uuid.uuid4())
    with redis_server.client() as r:
        spec = {"epochs": 1, "max_steps": 2}
        enqueue_job(r, queue=up.queue, job_id=job_id, spec=spec, owner=None, timeout_s=600)
    with Client(up.url, key) as c:
        wait_until(
            lambda: status_of(c, job_id) == "succeeded", 120, "the owner-less job", interval=0.2
        )
        assert job_id in [j["id"] for j in c.jobs()]

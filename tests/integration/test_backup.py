"""`trainq backup` and `trainq restore` (core.backup): a backup taken while a worker trains,
its newest jobs still in SQLite's write-ahead log, restored into a fresh data folder, holds
every job and model byte for byte and the local key; the restored service, on an empty
Redis, runs the jobs that were queued (the reconciler enqueues them again) with webhook
delivery paused. A restore refuses to run while `trainq up` holds the data folder, and a
backup that fails its checks replaces nothing. PostgreSQL: pg_dump and pg_restore, as
docs/operations.md says."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from cli.local.data_dir_lock import hold_data_dir
from client import Client
from core.db import Artifact, Database, Job
from core.schema import database_revision, head_revision
from core.webhooks.delivery_state import delivery_state
from tests.db import migrated
from tests.integration.test_retention import SHORT, TINY, ended_job
from tests.service import (
    REPO,
    STRICT,
    RedisServer,
    Service,
    fresh_service,
    postgres_database,
    wait_until,
)

RUNNING = {**TINY, "epochs": 200}  # trains until canceled
FAST = {"TRAINQ_RECONCILE_INTERVAL_S": "0.5", "TRAINQ_QUEUE_GRACE_S": "1"}


def trainq(
    *args: str, data_dir: Path, database_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINQ_")}
    env["TRAINQ_DATA_DIR"] = str(data_dir)
    if database_url is not None:
        env["TRAINQ_DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@dataclass(frozen=True)
class Contents:
    jobs: dict[str, tuple[str, str]]  # id -> (owner, spec as stored)
    models: dict[tuple[str, str], bytes]  # (job id, format) -> the file


def contents(database_url: str) -> Contents:
    db = Database(database_url)
    try:
        with db.reader() as s:
            jobs = {
                r.id: (str(r.owner), repr(r.spec))
                for r in s.execute(select(Job.id, Job.owner, Job.spec))
            }
            models = {
                (r.job_id, r.format): bytes(r.data)
                for r in s.execute(select(Artifact.job_id, Artifact.format, Artifact.data))
            }
    finally:
        db.dispose()
    return Contents(jobs, models)


def ended(c: Client, job_id: str) -> bool:
    return c.job(job_id)["status"] in ("succeeded", "failed", "canceled")


@pytest.mark.slow  # trains real digits in a service of its own, then restores it
def test_a_backup_taken_while_jobs_run_restores_every_job_and_model(
    tmp_path: Path, data_dir: Path
) -> None:
    (tmp_path / "a").mkdir()
    backup_dir = tmp_path / "backup"
    with fresh_service(tmp_path / "a", data_dir, FAST) as svc:
        key = svc.data_dir / "api_key"
        key.write_text("tq_local-key\n")
        key.chmod(0o600)
        svc.start_worker()
        svc.wait_for_workers(1)
        c = svc.client()
        first = c.submit(SHORT)["id"]
        wait_until(lambda: c.job(first)["status"] == "succeeded", 180, "a job to train", 0.2)
        running = c.submit(RUNNING)["id"]
        wait_until(lambda: c.job(running)["status"] == "running", 60, "a job to run", 0.2)
        newest = [c.submit(SHORT)["id"] for _ in range(3)]  # queued behind it
        wal = Path(f"{make_url(svc.database_url).database}-wal")
        assert wal.stat().st_size > 0  # what a copy of the file alone would miss is there
        before = contents(svc.database_url)
        assert {first, running, *newest} <= set(before.jobs) and (
            first,
            "torchscript",
        ) in before.models
        done = trainq(
            "backup", str(backup_dir), data_dir=svc.data_dir, database_url=svc.database_url
        )
        assert done.returncode == 0, done.stderr
        assert c.job(running)["status"] == "running"  # the service went on meanwhile

    restored = tmp_path / "b" / "data"
    os.makedirs(restored)
    os.symlink(data_dir / "mnist-sample", restored / "mnist-sample")
    done = trainq("restore", str(backup_dir), data_dir=restored)
    assert done.returncode == 0, done.stderr
    url = f"sqlite:///{restored / 'trainq.db'}"
    after = contents(url)
    assert {j: after.jobs.get(j) for j in before.jobs} == before.jobs
    assert {m: after.models.get(m) for m in before.models} == before.models
    assert (restored / "api_key").read_bytes() == b"tq_local-key\n"
    assert (restored / "api_key").stat().st_mode & 0o777 == 0o600
    with migrated(url) as db, db.reader() as s:
        assert delivery_state(s).paused

    # On a Redis that never saw these jobs: the queued ones run, the one running is lost.
    redis = RedisServer(tmp_path / "b" / "redis")
    redis.start()
    svc = Service(
        data_dir=restored, database_url=url, redis=redis, extra_env=FAST, log_dir=tmp_path / "b"
    )
    svc.extra_env["TRAINQ_HEARTBEAT_TIMEOUT_S"] = "3"
    try:
        svc.up(workers=1)
        c = svc.client()
        c.cancel(running)
        for job_id in [*newest, running]:
            wait_until(lambda j=job_id: ended(c, j), 300, f"job {job_id} to end", 0.5)
        assert [c.job(j)["status"] for j in newest] == ["succeeded"] * 3
        assert c.job(running)["status"] == "canceled"
    finally:
        svc.stop()
        redis.kill()


@pytest.fixture
def backed_up(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A data folder with a database of one job, and a backup of it."""
    data = tmp_path / "data"
    data.mkdir()
    with migrated(f"sqlite:///{data / 'trainq.db'}") as db, db.writer() as s:
        ended_job(s, days_ago=1)
    done = trainq("backup", str(tmp_path / "backup"), data_dir=data)
    assert done.returncode == 0, done.stderr
    yield data, tmp_path / "backup"


def test_a_restore_leaves_nothing_of_its_own_behind(
    backed_up: tuple[Path, Path], tmp_path: Path
) -> None:
    _, backup = backed_up
    done = trainq("restore", str(backup), data_dir=tmp_path / "new")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["trainq.db", "up.lock"]


def test_a_restore_refuses_while_trainq_up_holds_the_data_folder(
    backed_up: tuple[Path, Path],
) -> None:
    data, backup = backed_up
    (data / "trainq.db").write_bytes(b"the service's own")  # whatever is there stays
    lock = hold_data_dir(data)
    try:
        done = trainq("restore", str(backup), data_dir=data)
    finally:
        os.close(lock)
    assert done.returncode == 1 and "in use" in done.stderr, done.stderr
    assert (data / "trainq.db").read_bytes() == b"the service's own"


def test_a_restore_refuses_while_another_process_has_the_database_open(
    backed_up: tuple[Path, Path],
) -> None:
    """`trainq serve` and `trainq worker` take no lock on the data folder: the database
    open in any other process refuses the restore, naming it."""
    data, backup = backed_up
    held = (data / "trainq.db").read_bytes()
    user = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3,sys;c=sqlite3.connect(sys.argv[1]);"
         "c.execute('select 1 from alembic_version').fetchall();sys.stdin.read()",
         str(data / "trainq.db")],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_until(lambda: any(_opens(user.pid, data / "trainq.db")), 30, "the db open")
        done = trainq("restore", str(backup), data_dir=data)
    finally:
        user.kill()
        user.wait()
        assert user.stdin is not None
        user.stdin.close()
    assert done.returncode == 2, done.stderr
    assert f"open in process {user.pid}" in done.stderr, done.stderr
    assert (data / "trainq.db").read_bytes() == held


def _opens(pid: int, path: Path) -> list[str]:
    fds = Path(f"/proc/{pid}/fd")
    return [str(f) for f in fds.iterdir() if os.path.realpath(f) == str(path.resolve())]


def test_a_backup_that_is_no_database_is_refused_in_one_line(
    backed_up: tuple[Path, Path],
) -> None:
    data, backup = backed_up
    (backup / "trainq.db").write_bytes(b"not a database " * 100)
    done = trainq("restore", str(backup), data_dir=data)
    assert done.returncode == 2 and "nothing replaced" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("spoil", ["pages", "revision"])
def test_a_backup_that_fails_its_checks_replaces_nothing(
    backed_up: tuple[Path, Path], spoil: str
) -> None:
    data, backup = backed_up
    copy = backup / "trainq.db"
    if spoil == "pages":
        spoil_a_page(copy)
    else:
        with sqlite3.connect(copy) as c:
            c.execute("UPDATE alembic_version SET version_num = 'from-a-newer-trainq'")
    held = (data / "trainq.db").read_bytes()
    done = trainq("restore", str(backup), data_dir=data)
    assert done.returncode == 2 and "nothing replaced" in done.stderr, done.stderr
    assert (data / "trainq.db").read_bytes() == held
    assert not [p.name for p in data.iterdir() if "restoring" in p.name]


def spoil_a_page(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 4096] = b"\xff" * 4096  # a page in the middle
    path.write_bytes(bytes(raw))


def test_a_backup_of_a_spoiled_database_fails_and_leaves_no_copy(
    backed_up: tuple[Path, Path], tmp_path: Path
) -> None:
    data, _ = backed_up
    spoil_a_page(data / "trainq.db")
    done = trainq("backup", str(tmp_path / "again"), data_dir=data)
    assert done.returncode == 2 and "SQLite" in done.stderr, done.stderr
    assert list((tmp_path / "again").iterdir()) == []


def test_backup_of_a_postgresql_database_names_pg_dump(tmp_path: Path) -> None:
    done = trainq(
        "backup",
        str(tmp_path / "b"),
        data_dir=tmp_path,
        database_url="postgresql+psycopg://u@127.0.0.1/x",
    )
    assert done.returncode == 2 and "pg_dump" in done.stderr, done.stderr
    assert not (tmp_path / "b").exists()


def libpq(url: str) -> str:
    """A SQLAlchemy URL as pg_dump and pg_restore read it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def test_postgresql_is_backed_up_and_restored_with_pg_dump_and_pg_restore(tmp_path: Path) -> None:
    """The commands of docs/operations.md ("Backup and restore"), on a database with jobs
    and models, into an empty database: every job and model byte for byte, at head."""
    for tool in ("pg_dump", "pg_restore"):
        if shutil.which(tool) is None:
            missing = f"{tool} is not installed (apt-get install postgresql-client)"
            if STRICT:
                pytest.fail(missing)
            pytest.skip(missing)
    dump = tmp_path / "trainq.dump"
    for source in postgres_database():
        with migrated(source) as db, db.writer() as s:
            for _ in range(3):
                ended_job(s, days_ago=1, model=50_000)
        before = contents(source)
        subprocess.run(["pg_dump", "--format=custom", f"--file={dump}", libpq(source)], check=True)
        for target in postgres_database():
            subprocess.run(
                ["pg_restore", "--no-owner", f"--dbname={libpq(target)}", str(dump)], check=True
            )
            assert contents(target) == before
            restored = Database(target)
            try:
                with restored.engine.connect() as conn:
                    assert database_revision(conn) == head_revision()
            finally:
                restored.dispose()

"""A worker host through Redis outages, a full Redis and a worker killed mid-job: the
launcher stays up, an RQ worker parent outlives Redis's errors, and a work horse never
outlives its parent (two jobs would share one GPU)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rq import Worker

from client.http import ApiError, Client
from core.queue import job_queue
from tests.faults.process_tree import horses
from tests.recovery import FAST_RECOVERY, SPEC, STEPS
from tests.service import Service, children, fresh_service, status_of, wait_until


@pytest.fixture
def svc(tmp_path: Path, data_dir: Path) -> Iterator[Service]:
    with fresh_service(tmp_path, data_dir, FAST_RECOVERY) as service:
        yield service


def running(pid: int) -> bool:
    """Alive and not a zombie (an ended child its parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def workers_of(launcher: int) -> list[int]:
    """The launcher's `worker.rq_worker` children, running (and horses it adopted: forks of one)."""
    out = []
    for pid in children(launcher):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"worker.rq_worker" in cmd and running(pid):
            out.append(pid)
    return out


def worker_log(svc: Service) -> str:
    assert svc.log_dir is not None
    return (svc.log_dir / "worker0.log").read_text()


def wait_done(c: Client, job_id: str, timeout: float = 180) -> dict:
    done = ("succeeded", "failed", "canceled")
    wait_until(lambda: status_of(c, job_id) in done, timeout, f"job {job_id} to end", 0.2)
    return c.job(job_id)


def wait_step(c: Client, job_id: str, step: int) -> None:
    def reached() -> bool:
        try:
            return c.job(job_id)["progress"]["step"] >= step
        except ApiError:
            return False

    wait_until(reached, 120, f"job {job_id} to pass step {step}", 0.1)


def assert_every_step_once(c: Client, job_id: str, steps: int = STEPS) -> None:
    items = c.metrics(job_id, limit=5000)["items"]
    assert [p["step"] for p in items] == list(range(1, steps + 1))


def test_restart_delay_backs_off_and_clean_exits_never_count() -> None:
    from worker.launcher import RESTART_MAX_S, Slot, restart_delay

    slot = Slot(gpu=None, name="host-cpu")
    slot.started = float("inf")  # it never ran long enough to count as stable
    delays = [restart_delay(slot, 1) for _ in range(10)]
    assert delays[:3] == [1.0, 2.0, 4.0]
    assert delays[-1] == RESTART_MAX_S  # and on: it never gives up
    assert restart_delay(slot, 0) == 0.0
    assert slot.failures == 10  # the clean exit left the count alone


def test_the_launcher_restarts_no_worker_on_a_database_it_cannot_serve(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before it restarts a worker, the launcher checks the schema as `trainq worker` does
    at start: a database migrated past this trainq holds the restart back, said on
    stderr, and is checked again after the next back-off."""
    from worker.launcher import Slot, _restart_if_exited

    slot = Slot(gpu=None, name="host-cpu")
    slot.proc = subprocess.Popen(["true"])
    slot.proc.wait()
    exited = slot.proc
    problem = "the database is at revision 9999, newer than this trainq knows"
    _restart_if_exited(slot, "q", "redis://unused", held_back=False, check=lambda: problem)
    slot.restart_at = 0.0  # its back-off is over
    _restart_if_exited(slot, "q", "redis://unused", held_back=False, check=lambda: problem)
    assert slot.proc is exited  # nothing started
    assert slot.restart_at is not None and slot.restart_at > 0
    assert f"host-cpu: not restarted: {problem}" in capsys.readouterr().err


def test_the_launcher_outlasts_a_redis_outage(svc: Service) -> None:
    """Redis refuses connections while the launcher starts: it used to give up after six
    worker restarts in a minute. Now the worker waits for Redis, and once Redis is back it
    registers and runs a job, under the launcher it started with."""
    svc.redis.kill()
    launcher = svc.start_worker()
    wait_until(
        lambda: launcher.poll() is not None or worker_log(svc).count("Redis does not answer") >= 4,
        120,
        "the worker to wait for Redis a few times, or the launcher to give up",
        0.5,
    )
    assert launcher.poll() is None, worker_log(svc)[-2000:]
    svc.redis.start()
    svc.wait_for_workers(1)
    c = svc.client()
    job = c.submit({"epochs": 1, "max_steps": 2})
    assert wait_done(c, job["id"])["status"] == "succeeded"
    assert launcher.poll() is None


def test_the_worker_parent_survives_a_full_redis_mid_job(
    svc: Service, worker: subprocess.Popen[bytes]
) -> None:
    """Redis at maxmemory with noeviction answers every write with OOM: the RQ parent's
    heartbeats fail, and it used to quit, orphaning its horse. Now it logs and waits on."""
    launcher = worker
    (parent,) = workers_of(launcher.pid)
    c = svc.client()
    # Long enough that the parent beats for the horse under OOM (every 5 s) before the job
    # ends, on a CPU with bf16 (3 epochs take 3 s there) as on one without.
    job = c.submit(SPEC | {"epochs": 12})
    wait_step(c, job["id"], 2)
    r = svc.redis.client()
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)  # full at once: every write answers OOM
    try:
        wait_until(
            lambda: not running(parent) or "job heartbeat of" in worker_log(svc),
            60,
            "a job heartbeat under OOM",
            0.2,
        )
    finally:
        r.config_set("maxmemory", 0)
    assert running(parent), worker_log(svc)[-3000:]
    done = wait_done(c, job["id"])
    assert (done["status"], done["attempt"]) == ("succeeded", 1), done
    assert_every_step_once(c, job["id"], 12 * STEPS // 3)
    assert workers_of(launcher.pid) == [parent]
    r.close()


def test_a_worker_killed_mid_job_leaves_no_horse(
    svc: Service, worker: subprocess.Popen[bytes]
) -> None:
    """kill -9 of the RQ parent: its horse gets SIGTERM (parent-death signal) and hands
    the job back, and the launcher starts the next worker only once that horse is gone."""
    launcher = worker
    (parent,) = workers_of(launcher.pid)
    c = svc.client()
    job = c.submit(SPEC)
    wait_step(c, job["id"], 3)
    (horse,) = horses(parent)
    os.kill(parent, signal.SIGKILL)
    (successor,) = wait_until(
        lambda: [p for p in workers_of(launcher.pid) if p not in (parent, horse)] or None,
        120,
        "the launcher to start another worker",
        0.05,
    )
    assert not running(horse), "a second worker started beside the first one's horse"
    done = wait_done(c, job["id"])
    assert done["status"] == "succeeded", done
    assert_every_step_once(c, job["id"])
    assert launcher.poll() is None and running(successor)


def restart_empty(svc: Service) -> None:
    """Redis lost everything it held: killed, its files gone, started again on its port."""
    svc.redis.kill()
    for f in svc.redis.folder.rglob("*"):
        if f.is_file():
            f.unlink()
    svc.redis.start()


def registered(svc: Service) -> list[str]:
    """The names of the queue's workers as RQ reads them, the way /health and /metrics
    count them (straight from Redis: /health's answer may be a second old)."""
    with svc.redis.client() as r:
        return sorted(w.name for w in Worker.all(queue=job_queue(r, svc.queue)))


def counted(svc: Service) -> list[str] | None:
    """The workers /health counts and names to an admin; None while it answers 503."""
    try:
        health = svc.client(svc.admin_key).health()
    except ApiError:
        return None
    names = [w["name"] for w in health["workers"]]
    return names if health["workers_alive"] == len(names) else None


def state_of(svc: Service, name: str) -> str | None:
    """The state RQ registered for the worker `name` (started, idle, busy)."""
    with svc.redis.client() as r:
        state = r.hget(f"rq:worker:{name}", "state")
    return None if state is None else state.decode()


@pytest.mark.slow
@pytest.mark.parametrize("busy", [True, False], ids=["training", "idle"])
def test_a_worker_registers_again_after_redis_restarts_empty(
    svc: Service, worker: subprocess.Popen[bytes], busy: bool
) -> None:
    """A Redis that comes back empty has lost every worker's registration: the worker
    writes it again with its next heartbeat, training or idle, so /health and /metrics
    count it within seconds instead of showing no worker for good."""
    (name,) = registered(svc)
    c = svc.client()
    if busy:
        job = c.submit(SPEC | {"epochs": 60})  # trains on past every check below
        wait_step(c, job["id"], 2)
    else:  # waiting for a job: past RQ's clean-up as it starts (test_..._counted_once)
        wait_until(lambda: state_of(svc, name) == "idle", 30, "the worker to wait for a job")
    restart_empty(svc)
    wait_until(lambda: registered(svc) == [name], 15, "the worker to register again", 0.2)
    wait_until(lambda: counted(svc) == [name], 5, "/health to count the worker", 0.2)
    (parent,) = workers_of(worker.pid)
    if busy:
        assert c.job(job["id"])["status"] == "running"
        assert horses(parent), "the job's work horse is gone"


@pytest.mark.slow
@pytest.mark.parametrize("forged", [False, True], ids=["plain", "its next name forged"])
def test_a_worker_whose_loop_redis_failed_is_counted_once_when_redis_keeps_its_data(
    svc: Service, worker: subprocess.Popen[bytes], forged: bool
) -> None:
    """Redis away as a job ends: the work horse finishes it, but RQ's bookkeeping after it
    fails and ends RQ's loop, and so does recording that loop's end. The process starts
    a fresh RQ worker under the next name once Redis answers; a Redis that kept its data
    still holds the old registration, which the process removes first (no ghost counted
    for minutes beside it). A live registration under that next name (forged, or another
    host's worker of the same host name and process id: RQ refuses to start a worker by a
    name that has one) costs a name, not the process, and is left as it is."""
    (name,) = registered(svc)
    (parent,) = workers_of(worker.pid)
    if forged:
        with svc.redis.client() as r:
            r.hset(f"rq:worker:{name}-1", mapping={"birth": "2026-01-01T00:00:00Z"})
    c = svc.client()
    job = c.submit(SPEC)
    wait_step(c, job["id"], STEPS - 12)
    svc.redis.kill()  # its data kept (appendfsync always)
    wait_until(lambda: status_of(c, job["id"]) == "succeeded", 90, "the job to end", 0.2)
    ended = "the worker loop ended on an error"
    wait_until(lambda: ended in worker_log(svc), 60, "RQ's loop to end", 0.2)
    svc.redis.start()
    (again,) = wait_until(
        lambda: [n for n in registered(svc) if n != name] or None, 30, "the next RQ worker", 0.2
    )
    assert again == f"{name}-{2 if forged else 1}", again
    wait_until(lambda: registered(svc) == [again], 10, "one registration of the process", 0.2)
    wait_until(lambda: counted(svc) == [again], 5, "/health to count the worker once", 0.2)
    assert c.job(job["id"])["attempt"] == 1
    assert workers_of(worker.pid) == [parent]  # the same process: no restart of it
    with svc.redis.client() as r:
        if forged:
            assert r.hgetall(f"rq:worker:{name}-1") == {b"birth": b"2026-01-01T00:00:00Z"}
        assert f"rq:pubsub:{name}".encode() not in r.pubsub_channels()  # its channel closed

"""The queue is an API: a worker runs only `worker.tasks.train`, with the payload that the
contract in core.queue names. Any other entry is failed in RQ with the reason, nothing of it
runs, and the worker goes on to the next one. Secrets and host names stay off the wire."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis
from rq import Callback, Queue, Retry
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer
from rq.webhook import Webhook

from core.client import ApiError
from tests.service import RedisServer, Service, descendants, wait_until

TASK = "worker.tasks.train"
SPEC = {"epochs": 1, "max_steps": 3}
ENDED = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)


@pytest.fixture(scope="module")
def svc(
    service_data_dir: Path, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("db") / "trainq.db"
    service = Service(data_dir=service_data_dir, database_url=f"sqlite:///{db}", redis=redis_server)
    yield service.up(workers=1)
    service.stop()


@pytest.fixture
def r(svc: Service) -> Iterator[Redis]:
    client = svc.redis.client()
    yield client
    client.close()


def rq_queue(svc: Service, r: Redis) -> Queue:
    return Queue(svc.queue, connection=r, serializer=JSONSerializer)


def ended(r: Redis, entry: str) -> Job:
    job = Job.fetch(entry, connection=r, serializer=JSONSerializer)
    wait_until(lambda: job.get_status() in ENDED, 30, f"queue entry {entry} to end", 0.1)
    return job


def assert_refused(
    svc: Service, r: Redis, entry: str, reason: str, job_id: str | None = None
) -> None:
    job = ended(r, entry)
    assert job.get_status() == JobStatus.FAILED
    assert entry in FailedJobRegistry(svc.queue, connection=r, serializer=JSONSerializer)
    result = job.latest_result()
    assert result is not None and result.exc_string is not None
    assert result.exc_string.startswith("refused by trainq: ") and reason in result.exc_string
    # Nothing of it ran: no trainq job was made for it.
    with pytest.raises(ApiError) as e:
        svc.client(svc.admin_key).job(job_id or entry)
    assert e.value.status == 404


def test_a_shell_command_on_the_queue_never_runs(svc: Service, r: Redis, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    entry = str(uuid.uuid4())
    rq_queue(svc, r).enqueue("os.system", f"touch {marker}", job_id=entry)
    ended(r, entry)
    assert not marker.exists()
    assert_refused(svc, r, entry, "only worker.tasks.train runs on a trainq worker")


Enqueue = Callable[[Queue, str], object]
REFUSED: dict[str, tuple[Enqueue, str]] = {
    "on_success": (
        lambda q, e: q.enqueue(TASK, spec=SPEC, job_id=e, on_success=Callback("os.system")),
        "callbacks are refused: ['os.system']",
    ),
    "on_failure": (
        lambda q, e: q.enqueue(TASK, spec=SPEC, job_id=e, on_failure=Callback("os.system")),
        "callbacks are refused: ['os.system']",
    ),
    "on_stopped": (
        lambda q, e: q.enqueue(TASK, spec=SPEC, job_id=e, on_stopped=Callback("os.system")),
        "callbacks are refused: ['os.system']",
    ),
    "webhook": (
        lambda q, e: q.enqueue(
            TASK, spec=SPEC, job_id=e, webhooks=[Webhook("http://127.0.0.1:9/", "finished")]
        ),
        "webhooks are refused",
    ),
    "rq retry": (
        lambda q, e: q.enqueue(TASK, spec=SPEC, job_id=e, retry=Retry(max=2)),
        "RQ retries and repeats are refused",
    ),
    "positional args": (
        lambda q, e: q.enqueue_call(TASK, args=[SPEC], job_id=e),
        "positional arguments are refused",
    ),
    "bad job_id": (
        lambda q, e: q.enqueue_call(
            TASK, kwargs={"spec": SPEC, "job_id": "../../etc"}, job_id=f"{e}-a2"
        ),
        "job_id= must be a UUID",
    ),
    "oversized spec": (
        lambda q, e: q.enqueue_call(TASK, kwargs={"spec": {"dataset": "x" * 20_000}}, job_id=e),
        "bytes as JSON; at most 16384",
    ),
    "too deep a spec": (
        lambda q, e: q.enqueue_call(
            TASK, kwargs={"spec": {"a": {"b": {"c": {"d": {"e": 1}}}}}}, job_id=e
        ),
        "spec= nests deeper than 4 levels",
    ),
    "non-string owner": (
        lambda q, e: q.enqueue_call(TASK, kwargs={"spec": SPEC, "owner": 123}, job_id=e),
        "owner= must be a string",
    ),
    "unknown keyword": (
        lambda q, e: q.enqueue_call(TASK, kwargs={"spec": SPEC, "cwd": "/"}, job_id=e),
        "unknown keywords ['cwd']",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_entry_outside_the_contract_is_failed_with_its_reason(
    svc: Service, r: Redis, case: str
) -> None:
    enqueue, reason = REFUSED[case]
    entry = str(uuid.uuid4())
    enqueue(rq_queue(svc, r), entry)
    if case == "bad job_id":
        assert_refused(svc, r, f"{entry}-a2", reason, job_id=entry)
    else:
        assert_refused(svc, r, entry, reason)


def test_an_entry_id_that_is_no_uuid_is_refused(svc: Service, r: Redis) -> None:
    rq_queue(svc, r).enqueue_call(TASK, kwargs={"spec": SPEC}, job_id="not-a-uuid")
    job = ended(r, "not-a-uuid")
    assert job.get_status() == JobStatus.FAILED
    result = job.latest_result()
    assert result is not None and "is not a UUID" in (result.exc_string or "")


@pytest.fixture(scope="module")
def trained(svc: Service) -> str:
    """A job of key alice's, run to the end by the worker that refused all the above."""
    c = svc.client()
    job_id = str(c.submit(SPEC)["id"])
    wait_until(lambda: c.job(job_id)["status"] == "succeeded", 90, "the job", interval=0.2)
    return job_id


def test_the_worker_still_runs_a_normal_job_after_refusing(svc: Service, trained: str) -> None:
    job = svc.client().job(trained)
    assert job["status"] == "succeeded" and job["progress"]["step"] == 3


def test_the_run_record_names_the_host_to_admins_only(svc: Service, trained: str) -> None:
    assert "host" not in svc.client().record(trained)
    assert svc.client(svc.admin_key).record(trained)["host"]


def test_the_redis_password_is_on_no_worker_command_line(
    service_data_dir: Path, tmp_path: Path
) -> None:
    """A redis-server of its own that asks for a password; the worker launcher and the RQ
    worker it starts get the URL by environment, never in /proc/<pid>/cmdline."""
    locked = RedisServer(tmp_path / "redis")
    locked.start()
    password = f"pw-{uuid.uuid4().hex}"
    locked.client().config_set("requirepass", password)
    url = f"redis://:{password}@127.0.0.1:{locked.port}/0"
    svc = Service(
        data_dir=service_data_dir,
        database_url=f"sqlite:///{tmp_path / 'trainq.db'}",
        redis=locked,
        extra_env={"TRAINQ_REDIS_URL": url},
    )
    try:
        svc.up(workers=1)  # registered: the worker reached Redis with the password
        launcher = svc.workers[0]
        procs = [launcher.pid, *descendants(launcher.pid)]
        assert len(procs) >= 2  # the launcher and its RQ worker
        for pid in procs:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert password.encode() not in cmdline, cmdline
    finally:
        svc.stop()
        locked.kill()

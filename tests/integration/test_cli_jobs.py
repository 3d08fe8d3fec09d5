"""`trainq` commands that take a job or sweep, run as a user's shell runs them (through
`cli.main.main`, in this process: tests/cli_runs.py) against a real service: an id's first
characters name it, as `ls` shows them, within the key's own jobs; a download without
--format gets the best format the job has; --url and --key choose the API and the key;
--check refuses a record whose image shape is no data set's. An exception a command lets
through fails its test, as a traceback would show it to a user."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from core.db import Database, Job
from core.owners import owner_id
from core.spec import JobStatus
from core.store import create_job
from tests.cli_runs import Ran, run_trainq
from tests.service import Service, trained

DEAD_URL = "http://127.0.0.1:9"


Trainq = Callable[..., Ran]


@pytest.fixture
def trainq(
    service: Service, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Trainq:
    """`trainq(*argv, key=None, cwd=None, **settings)`: with the service's address and `key`
    (the module's first) in TRAINQ_API_URL and TRAINQ_API_KEY, as a user has them, unless
    `settings` names others."""

    def run(*argv: str, key: str | None = None, cwd: Path | None = None, **settings: str) -> Ran:
        env = {"TRAINQ_API_URL": service.url, "TRAINQ_API_KEY": key or service.keys[0]}
        return run_trainq(capsys, monkeypatch, list(argv), {**env, **settings}, cwd)

    return run


@pytest.fixture(scope="module")
def database(service: Service) -> Iterator[Database]:
    db = Database(service.database_url)
    yield db
    db.dispose()


def ended_job(db: Database, job_id: str, key: str) -> str:
    """A canceled job of `key`'s whose id we chose, written as the API would have."""
    with db.writer() as s:
        job = create_job(s, job_id=job_id, spec={"epochs": 1}, owner=owner_id(key))
        job.status = JobStatus.canceled
        job.finished_at = dt.datetime.now(dt.UTC)
    return job_id


@pytest.fixture(scope="module")
def twins(service: Service, database: Database) -> tuple[str, str, str]:
    """Two jobs of the first key's whose ids share their first 6 characters (random ones
    never do), and one of the second key's that starts the same."""
    stem = uuid.uuid4().hex[:6]
    first, second, other = (f"{stem}{seventh}{str(uuid.uuid4())[7:]}" for seventh in "abc")
    ended_job(database, first, service.keys[0])
    ended_job(database, second, service.keys[0])
    ended_job(database, other, service.keys[1])
    return first, second, other


def test_an_ids_first_characters_name_the_job_in_every_command(
    trainq: Trainq, twins: tuple[str, str, str]
) -> None:
    first, _, _ = twins
    short = first[:8]
    watched = trainq("watch", short)
    ended = json.loads(watched.stdout.splitlines()[-1])
    assert watched.returncode == 1 and (ended["id"], ended["status"]) == (first, "canceled")
    canceled = trainq("cancel", short.upper())
    assert canceled.returncode == 1 and f"job {first} already ended" in canceled.stderr
    compared = trainq("compare", short, first[:10])
    assert compared.returncode == 0, compared.stderr
    assert compared.stdout.splitlines()[0].split() == [first[:8], first[:8]]


def test_a_prefix_of_two_jobs_lists_them_and_one_of_none_says_so(
    trainq: Trainq, twins: tuple[str, str, str]
) -> None:
    first, second, _ = twins
    for command in ("watch", "download", "cancel"):
        out = trainq(command, first[:6])
        assert out.returncode == 1, out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
        assert f"job id {first[:6]} is ambiguous" in out.stderr
        assert first in out.stderr and second in out.stderr
    missing = "0000" if not first.startswith("0000") else "ffff"
    out = trainq("download", missing)
    assert out.returncode == 1 and out.stderr == f"trainq: no job {missing}\n"
    out = trainq("watch", "abc")
    assert out.returncode == 1 and "first 4 characters or more" in out.stderr


def test_a_prefix_never_finds_another_keys_job(
    service: Service, trainq: Trainq, twins: tuple[str, str, str]
) -> None:
    first, _, other = twins
    out = trainq("watch", other[:8], key=service.keys[0])
    assert out.returncode == 1 and out.stderr == f"trainq: no job {other[:8]}\n"
    # The API's listing by prefix is the caller's own jobs alone; an admin's, everyone's.
    listed = service.client(service.keys[1]).jobs(id_prefix=first[:6])
    assert [j["id"] for j in listed] == [other]
    everyone = service.client(service.admin_key).jobs(id_prefix=first[:6])
    assert sorted(j["id"] for j in everyone) == sorted(twins)
    r = httpx.get(
        f"{service.url}/jobs",
        params={"id_prefix": first[:3]},
        headers={"Authorization": f"Bearer {service.keys[0]}"},
    )
    assert r.status_code == 422  # too short to name anything


def test_a_sweeps_first_characters_name_it(service: Service, trainq: Trainq) -> None:
    c = service.client()
    base = {"epochs": 1, "max_steps": 1, "export": ["torchscript"]}
    sweep = c.create_sweep({"base": base, "space": {"lr": {"choice": [1e-3, 2e-3]}}})
    c.cancel_sweep(sweep["id"])
    shown = trainq("sweep", "show", sweep["id"][:8], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == sweep["id"]
    canceled = trainq("sweep", "cancel", sweep["id"][:8])
    assert canceled.returncode == 1 and "already ended" in canceled.stderr
    watched = trainq("sweep", "watch", sweep["id"][:8])
    assert watched.returncode == 3, watched.stderr
    out = trainq("sweep", "watch", sweep["id"][:8], key=service.keys[1])
    assert out.returncode == 1 and out.stderr == f"trainq: no sweep {sweep['id'][:8]}\n"


def test_url_and_key_override_the_environment(
    service: Service, trainq: Trainq, twins: tuple[str, str, str]
) -> None:
    env = {"TRAINQ_API_URL": DEAD_URL, "TRAINQ_API_KEY": "not-a-key"}
    api = ["--url", service.url, "--key", service.keys[1]]
    out = trainq("ls", *api, **env)
    assert out.returncode == 0, out.stderr
    assert twins[2] in out.stdout and twins[0] not in out.stdout
    for argv in (["sweep", *api, "list"], ["sweep", "list", *api]):
        out = trainq(*argv, **env)
        assert out.returncode == 0, (argv, out.stderr)


@pytest.fixture(scope="module")
def onnx_only(service: Service) -> dict[str, Any]:
    """The README's sweep example's export: ONNX alone."""
    return trained(service.client(), {"epochs": 1, "max_steps": 2, "export": ["onnx"]})


@pytest.mark.slow  # an ONNX export
def test_the_default_download_is_the_best_format_the_job_has(
    service: Service, trainq: Trainq, onnx_only: dict[str, Any], tmp_path: Path
) -> None:
    assert onnx_only["formats"] == ["onnx"] and onnx_only["default_format"] == "onnx"
    r = httpx.get(
        f"{service.url}{onnx_only['links']['model']}",
        headers={"Authorization": f"Bearer {service.keys[0]}"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-disposition"].endswith('.onnx"')
    out = trainq("download", onnx_only["id"][:8], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    model = tmp_path / f"trainq-{onnx_only['id']}.onnx"
    assert model.read_bytes() == r.content
    asked = trainq("download", onnx_only["id"], "--format", "torchscript", cwd=tmp_path)
    assert asked.returncode == 1 and "offers no torchscript model" in asked.stderr
    checked = trainq("download", onnx_only["id"], "--check", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "1×28×28 images in, logits shape (1, 10)" in checked.stderr


@pytest.mark.slow  # an ONNX export
@pytest.mark.parametrize(
    "shape",
    [[1, 2, 2], [7, 28, 28], [1, 28, 28, 28], ["1", 28, 28], [1, 28, 100_000], None],
    ids=str,
)
def test_check_runs_no_model_on_a_shape_no_data_set_has(
    service: Service,
    trainq: Trainq,
    database: Database,
    onnx_only: dict[str, Any],
    tmp_path: Path,
    shape: Any,
) -> None:
    job_id = onnx_only["id"]
    record = service.client().record(job_id)
    forged = {**record, "dataset": {**record["dataset"], "image_shape": shape}}
    with database.writer() as s:
        s.execute(update(Job).where(Job.id == job_id).values(record=forged))
    try:
        out = trainq("download", job_id, "--check", cwd=tmp_path)
    finally:
        with database.writer() as s:
            s.execute(update(Job).where(Job.id == job_id).values(record=record))
    assert out.returncode == 1, out.stderr
    assert "the model was not run" in out.stderr and "Traceback" not in out.stderr

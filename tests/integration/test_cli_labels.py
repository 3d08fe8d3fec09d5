"""`trainq submit --name --tag --notes`, `tag`, `rename`, `note` and `ls`'s filters and
orders, run as a user's shell runs them against a real service (tests/cli_runs.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from core.db import Database
from core.labels import Labels
from core.owners import owner_id
from core.spec import JobSpec, JobStatus
from core.store import claim_job, create_job, end_job, succeed_job
from tests.cli_runs import Ran, run_trainq
from tests.service import Service

SMALL = ("--epochs", "1", "--max-steps", "1")
Trainq = Callable[..., Ran]


@pytest.fixture
def trainq(
    service: Service, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Trainq:
    """`trainq(*argv, key=None, cwd=None)` with the service's address and a key of its."""

    def run(*argv: str, key: str | None = None, cwd: Path | None = None) -> Ran:
        env = {"TRAINQ_API_URL": service.url, "TRAINQ_API_KEY": key or service.keys[0]}
        return run_trainq(capsys, monkeypatch, list(argv), env, cwd)

    return run


@pytest.fixture(scope="module")
def database(service: Service) -> Iterator[Database]:
    db = Database(service.database_url)
    yield db
    db.dispose()


def ended(db: Database, key: str, status: JobStatus, accuracy: float, **labels: object) -> str:
    """A job of `key`'s that ended, written as the API and a worker would have."""
    job_id = str(uuid.uuid4())
    with db.writer() as s:
        spec = JobSpec(epochs=1)
        create_job(s, job_id=job_id, spec=spec, owner=owner_id(key), labels=Labels(**labels))
    with db.writer() as s:
        claim_job(s, job_id=job_id, worker="w", device="cpu")
    with db.writer() as s:
        if status is JobStatus.succeeded:
            figures = {"test_loss": 0.1, "train_loss": 0.1, "images_per_second": 100.0}
            result = {"test_accuracy": accuracy, "duration_s": 1.0, "epochs": 1, "steps": 1}
            result |= figures
            assert succeed_job(s, job_id=job_id, attempt=1, result=result, record={}, models=[])
        else:
            assert end_job(s, job_id=job_id, status=status, attempt=1)
    return job_id


def test_submit_names_tags_and_annotates_and_tag_rename_note_change_them(
    service: Service, trainq: Trainq
) -> None:
    out = trainq(
        "submit", *SMALL, "--name", "first try", "--tag", "cli", "--tag", "x", "--notes", "why"
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    c = service.client()
    job = c.job(job_id)
    assert (job["name"], job["tags"], job["notes"]) == ("first try", ["cli", "x"], "why")
    short = job_id[:8]
    tagged = trainq("tag", short, "+a", "-x", "b")
    assert tagged.returncode == 0, tagged.stderr
    assert tagged.stdout == "cli a b\n" and c.job(job_id)["tags"] == ["cli", "a", "b"]
    assert trainq("tag", short).stdout == "cli a b\n"
    assert trainq("rename", short, "second try").stdout == f"{job_id} second try\n"
    assert trainq("note", short, "").returncode == 0
    job = c.job(job_id)
    assert (job["name"], job["notes"]) == ("second try", None)
    bad = trainq("tag", short, "+no space")
    assert bad.returncode == 2 and "add_tags.0" in bad.stderr
    too_many = trainq("tag", short, *[f"+t{i}" for i in range(14)])
    assert too_many.returncode == 2 and "at most 16" in too_many.stderr
    theirs = trainq("tag", short, "+mine", key=service.keys[1])
    assert theirs.returncode == 1 and f"no job {short}" in theirs.stderr
    c.cancel(job_id)


def test_ls_filters_and_sorts(service: Service, database: Database, trainq: Trainq) -> None:
    tag = f"ls-{uuid.uuid4().hex[:6]}"
    key = service.keys[0]
    low = ended(database, key, JobStatus.succeeded, 0.91, name="pre low", tags=(tag,))
    high = ended(database, key, JobStatus.succeeded, 0.97, name="Pre high", tags=(tag,))
    ended(database, key, JobStatus.succeeded, 0.99, name="other", tags=(tag,))
    failed = ended(database, key, JobStatus.failed, 0, name="pre failed", tags=(tag,))
    ended(database, service.keys[1], JobStatus.succeeded, 0.999, name="pre theirs", tags=(tag,))
    out = trainq(
        "ls", "--tag", tag, "--status", "succeeded", "--sort", "-test_accuracy", "--name", "pre"
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["id", "status", "name", "tags"]
    assert [line.split()[0] for line in lines[1:]] == [high, low]
    assert "Pre high" in lines[1] and tag in lines[1] and "0.9700" in lines[1]
    out = trainq(
        "ls", "--tag", tag, "--status", "failed,succeeded", "--name", "pre", "--sort", "created"
    )
    assert [line.split()[0] for line in out.stdout.splitlines()[1:]] == [low, high, failed]
    bad = trainq("ls", "--sort", "-accuracy")
    assert bad.returncode == 2 and "sort:" in bad.stderr
    bad = trainq("ls", "--status", "done")
    assert bad.returncode == 2 and "--status" in bad.stderr

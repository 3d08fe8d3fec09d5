"""`pip install trainq`, without extras, is the light client: in a fresh venv it submits a
job over HTTP and enqueues one through the queue contract onto a real service, and neither
torch, torchvision, sqlalchemy, fastapi nor onnx (or onnxruntime) is installed there, let alone
imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.service import REPO, Service, status_of, wait_until

pytestmark = pytest.mark.slow

HEAVY = ("torch", "torchvision", "sqlalchemy", "fastapi", "onnx", "onnxscript", "onnxruntime")
PIP_TIMEOUT_S = 600

PRODUCER = """
import importlib.util, json, sys, uuid

from redis import Redis

from client import Client, owner_for_key
from core.queue import enqueue_job
from core.spec import JobSpec

api_url, key, redis_url, queue = sys.argv[1:5]
spec = JobSpec(epochs=1, max_steps=3).model_dump(mode="json", exclude_defaults=True)
with Client(api_url, key) as c:
    submitted = c.submit(spec)["id"]
enqueued = str(uuid.uuid4())
with Redis.from_url(redis_url) as r:
    enqueue_job(
        r, queue=queue, job_id=enqueued, spec=spec, owner=owner_for_key(key), timeout_s=600
    )
heavy = sys.argv[5].split(",")
print(json.dumps({
    "submitted": submitted,
    "enqueued": enqueued,
    "imported": sorted({m.split(".")[0] for m in sys.modules} & set(heavy)),
    "installed": [m for m in heavy if importlib.util.find_spec(m) is not None],
}))
"""


def _clean_env() -> dict[str, str]:
    """Nothing of this checkout's environment: the venv's own packages alone."""
    drop = ("TRAINQ_", "PYTHON", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _sources(into: Path) -> Path:
    """The files a wheel of trainq is built from (as Dockerfile.gpu copies them), so the
    build writes nothing into the checkout."""
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    into.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, into / name)
    for package in tool["setuptools"]["packages"]["find"]["include"]:
        name = package.rstrip("*")
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPO / name, into / name, ignore=ignore)
    return into


@pytest.fixture(scope="module")
def light_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("light")
    venv = root / "venv"
    subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True, env=_clean_env())
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(_sources(root / "src"))],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return python


def produce(python: Path, service: Service, key: str) -> dict[str, Any]:
    args = [service.url, key, service.redis.url, service.queue, ",".join(HEAVY)]
    out = subprocess.run(
        [str(python), "-I", "-c", PRODUCER, *args],
        cwd=python.parent,  # nothing of the checkout on the path
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_the_light_install_submits_and_enqueues(light_python: Path, service: Service) -> None:
    key = service.keys[0]
    result = produce(light_python, service, key)
    assert result["installed"] == []
    assert result["imported"] == []
    c = service.client(key)
    for job_id in (result["submitted"], result["enqueued"]):
        wait_until(lambda j=job_id: status_of(c, j) == "succeeded", 90, "the job", interval=0.2)

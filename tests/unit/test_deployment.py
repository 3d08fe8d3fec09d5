"""The deployment files: docker-compose.yml and Dockerfile.gpu, checked as data and text.

Without a Docker engine, these tests check what the files promise: one GPU per worker, the
schema migrated before anything uses it, health checks, no secrets in the file, and an image
whose torch is the one pyproject.toml pins.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile.gpu"

SECRET_NAME = re.compile(r"PASSWORD|KEY|SECRET|TOKEN", re.IGNORECASE)
# ${VAR}, ${VAR:?message}, ${VAR?message}, ${VAR:-default}, ${VAR-default}
REFERENCE = re.compile(r"\$\{(?P<var>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<rest>[^}]*))?\}")
URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:(?P<password>[^@]*)@")


# --- docker-compose.yml ------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict), "docker-compose.yml is not a mapping"
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def command_of(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command", [])
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


def workers_of(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if command_of(s)[:2] == ["trainq", "worker"]}


def trainq_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if command_of(s)[:1] == ["trainq"]}


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def is_reference(value: str) -> bool:
    """A whole-value ${VAR...} reference whose default, if any, is empty (no secret literal
    hiding in `${VAR:-hunter2}`)."""
    m = REFERENCE.fullmatch(value)
    if m is None:
        return False
    return m["op"] not in ("-", ":-") or m["rest"] == ""


def secret_literals(node: Any, path: str = "") -> list[str]:
    """Every place in the document where a secret is written out rather than referenced: the
    value of a key named like a password/key/secret/token, `NAME=value` list entries of such
    names, and the password part of any URL."""
    found: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            here = f"{path}.{k}"
            secret = SECRET_NAME.search(str(k)) and isinstance(v, str | int | float)
            if secret and not is_reference(str(v)):
                found.append(f"{here}={v!r}")
            found += secret_literals(v, here)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += secret_literals(v, f"{path}[{i}]")
    elif isinstance(node, str):
        name, sep, value = node.partition("=")
        is_var = sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
        if is_var and SECRET_NAME.search(name) and not is_reference(value):
            found.append(f"{path}={node!r}")
        for m in URL_PASSWORD.finditer(node):
            if not is_reference(m["password"]):
                found.append(f"{path}: URL password {m['password']!r}")
    return found


def test_compose_has_the_services(services: dict[str, dict[str, Any]]) -> None:
    assert {"redis", "postgres", "migrate", "api"} <= services.keys()
    assert workers_of(services), "no service runs `trainq worker`"
    assert "version" not in yaml.safe_load(COMPOSE.read_text()), "the compose spec has no version"


def test_every_worker_reserves_exactly_one_nvidia_gpu(
    services: dict[str, dict[str, Any]],
) -> None:
    device_ids: list[str] = []
    for name, svc in workers_of(services).items():
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1, f"{name}: {devices}"
        (dev,) = devices
        assert dev["driver"] == "nvidia", name
        assert "gpu" in dev["capabilities"], name
        ids = [str(i) for i in dev.get("device_ids", [])]
        assert len(ids) == 1 or (not ids and dev.get("count") == 1), f"{name}: {dev}"
        device_ids += ids
        # The container sees only its reserved GPU, as index 0.
        cmd = command_of(svc)
        assert cmd[cmd.index("--gpus") + 1] == "0", f"{name}: {cmd}"
    assert len(device_ids) == len(set(device_ids)), f"two workers share a GPU: {device_ids}"


def test_workers_shut_down_warm(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in workers_of(services).items():
        grace = str(svc.get("stop_grace_period", "10s"))
        m = re.fullmatch(r"(\d+)(s|m|h)", grace)
        assert m, f"{name}: stop_grace_period {grace!r}"
        seconds = int(m[1]) * {"s": 1, "m": 60, "h": 3600}[m[2]]
        assert seconds >= 60, f"{name}: {grace} is too short for RQ's warm shutdown"
        assert svc.get("restart") == "unless-stopped", name


def test_redis_appends_to_its_log(services: dict[str, dict[str, Any]]) -> None:
    cmd = command_of(services["redis"])
    assert cmd[0] == "redis-server"
    i = cmd.index("--appendonly")
    assert cmd[i + 1] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])


@pytest.mark.parametrize("name", ["postgres", "redis", "api"])
def test_has_a_healthcheck(services: dict[str, dict[str, Any]], name: str) -> None:
    check = services[name].get("healthcheck")
    assert check, f"{name} has no healthcheck"
    assert not check.get("disable"), f"{name}'s healthcheck is disabled"
    test = check["test"]
    assert isinstance(test, list)
    assert test[0] in ("CMD", "CMD-SHELL"), test
    assert len(test) > 1


def test_api_healthcheck_gets_health(services: dict[str, dict[str, Any]]) -> None:
    test = " ".join(services["api"]["healthcheck"]["test"])
    assert "/health" in test
    assert "urlopen" in test  # the image has python, not curl


def test_migrate_runs_once_before_api_and_workers(
    services: dict[str, dict[str, Any]],
) -> None:
    migrate = services["migrate"]
    assert command_of(migrate) == ["trainq", "migrate"]
    assert migrate.get("restart") == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    dependents = {"api": services["api"], **workers_of(services)}
    for name, svc in dependents.items():
        cond = svc["depends_on"]["migrate"]["condition"]
        assert cond == "service_completed_successfully", f"{name}: {cond}"


def test_api_and_workers_wait_for_healthy_stores(services: dict[str, dict[str, Any]]) -> None:
    dependents = {"api": services["api"], **workers_of(services)}
    for name, svc in dependents.items():
        for store in ("postgres", "redis"):
            assert svc["depends_on"][store]["condition"] == "service_healthy", (name, store)


def test_trainq_services_share_one_image_and_its_settings(
    services: dict[str, dict[str, Any]],
) -> None:
    build = services["migrate"]["build"]
    assert (ROOT / build.get("context", ".") / build["dockerfile"]).resolve() == DOCKERFILE
    image = services["migrate"]["image"]
    ours = trainq_services(services)
    assert {"migrate", "api"} | workers_of(services).keys() <= ours.keys()
    for name, svc in ours.items():
        assert svc["image"] == image, name
        env = env_of(svc)
        assert env["TRAINQ_DATABASE_URL"].startswith("postgresql+psycopg://"), name
        assert "@postgres:5432/" in env["TRAINQ_DATABASE_URL"], name
        assert env["TRAINQ_REDIS_URL"].startswith("redis://redis:6379/"), name
        assert env["TRAINQ_DATA_DIR"] == "/data", name
        assert "trainq-data:/data" in svc["volumes"], name
    assert is_reference(env_of(services["api"])["TRAINQ_API_KEYS"])
    assert "8000:8000" in [str(p) for p in services["api"]["ports"]]


def test_the_api_and_the_workers_read_the_same_torch_home(
    services: dict[str, dict[str, Any]],
) -> None:
    """torchvision's pretrained weights: the API checks a submission against the files the
    workers load (docs/models.md), so both see one folder, and neither writes to it."""
    ours = trainq_services(services)
    homes = {env_of(ours[n])["TORCH_HOME"] for n in ("api", *workers_of(services))}
    assert len(homes) == 1, homes
    (home,) = homes
    mounts = {
        n: [str(v) for v in ours[n]["volumes"] if str(v).endswith((f":{home}", f":{home}:ro"))]
        for n in ("api", *workers_of(services))
    }
    assert all(len(m) == 1 and m[0].endswith(":ro") for m in mounts.values()), mounts
    assert len({m[0] for m in mounts.values()}) == 1, mounts


def test_no_secret_literals(compose: dict[str, Any]) -> None:
    assert secret_literals(compose) == []
    # The file really does wire the secrets in, through references.
    assert is_reference(env_of(compose["services"]["postgres"])["POSTGRES_PASSWORD"])


@pytest.mark.parametrize(
    "doc",
    [
        {"environment": {"POSTGRES_PASSWORD": "hunter2"}},
        {"environment": {"TRAINQ_API_KEYS": "abc,def"}},
        {"environment": {"TRAINQ_API_KEYS": "${TRAINQ_API_KEYS:-abc}"}},
        {"environment": ["AWS_SECRET_ACCESS_KEY=xyz"]},
        {"environment": {"URL": "postgresql+psycopg://trainq:hunter2@postgres:5432/trainq"}},
        {"command": ["x", "--url", "redis://:s3cret@redis:6379/0"]},
    ],
)
def test_secret_literals_are_caught(doc: dict[str, Any]) -> None:
    assert secret_literals(doc), doc


def test_named_volumes_are_declared(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    declared = set(compose.get("volumes") or {})
    used = set()
    for svc in services.values():
        for v in svc.get("volumes", []):
            source = v["source"] if isinstance(v, dict) else str(v).split(":", 1)[0]
            if not source.startswith((".", "/", "~", "$")):
                used.add(source)
    assert used, "no service uses a named volume"
    assert used <= declared, f"undeclared: {used - declared}"
    assert {"trainq-data"} <= declared
    pg = services["postgres"]["volumes"]
    assert any(str(v).endswith(":/var/lib/postgresql/data") for v in pg), pg


# --- Dockerfile.gpu ----------------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, args = full.partition(" ")
            out.append((word.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def last(name: str) -> str:
    found = [args for word, args in instructions() if word == name]
    assert found, f"Dockerfile.gpu has no {name}"
    return found[-1]


def torch_pin() -> str:
    """The torch that the API and the worker extras pin (the base install has none)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert not [d for d in project["dependencies"] if d.startswith("torch")], project
    pins = [
        d.split("==", 1)[1].strip()
        for extra in ("server", "worker")
        for d in extras[extra]
        if re.fullmatch(r"torch\s*==.*", d)
    ]
    assert len(pins) == 2 and len(set(pins)) == 1, extras
    return pins[0]


def test_image_is_the_pytorch_runtime_of_the_pinned_torch() -> None:
    image = last("FROM").split()[0]
    repo, _, tag = image.partition(":")
    assert repo == "pytorch/pytorch", image
    pin = torch_pin()
    assert re.fullmatch(r"\d+\.\d+\.\d+", pin), pin
    assert tag.startswith(f"{pin}-cuda"), f"{image} does not carry torch {pin}"
    assert tag.endswith("-runtime"), f"{image} is not a runtime image"


def test_runs_as_a_user_that_is_not_root() -> None:
    user = last("USER")
    name, _, group = user.partition(":")
    assert name not in ("root", "0"), user
    assert group not in ("root", "0"), user


def test_has_a_healthcheck_on_health() -> None:
    check = last("HEALTHCHECK")
    assert check.upper() != "NONE"
    assert "CMD" in check
    assert "/health" in check


def test_cmd_runs_trainq() -> None:
    cmd = json.loads(last("CMD"))  # exec form: signals reach trainq itself
    assert cmd[0] == "trainq", cmd


def test_copies_every_package_and_installs_the_data_set_source() -> None:
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = [p.rstrip("*") for p in find["packages"]["find"]["include"]]
    copied = {args.split()[0].rstrip("/") for word, args in instructions() if word == "COPY"}
    assert set(packages) <= copied, f"not copied into the image: {set(packages) - copied}"
    runs = " ".join(args for word, args in instructions() if word == "RUN")
    assert re.search(r"pip install [^&]*--no-deps[^&]*\bmlxtend\b", runs), runs
    # The base install is the light client: the image needs the API's and the worker's extras.
    assert re.search(r"pip install [^&]*trainq\[[^\]]*\ball\b", runs), runs
    env = " ".join(args for word, args in instructions() if word == "ENV")
    assert "TRAINQ_DATA_DIR=/data" in env

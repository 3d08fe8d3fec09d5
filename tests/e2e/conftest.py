"""Real parts for the browser tests: a redis-server, a SQLite database, the API and one CPU
worker (as in tests/integration), and headless Chromium driven by Playwright.

The browser is Debian's `chromium` package, not a Playwright download. Without it (or
without the `playwright` package) the tests skip, unless TRAINQ_TEST_STRICT=1 (as in CI)
makes them fail instead.

The browser and the service are started once for the package (this directory) and stopped
after its last test: each test signs in on a page of its own and works on jobs it
submitted itself."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service import REPO, STRICT, RedisServer, Service

CHROMIUM = os.environ.get("TRAINQ_TEST_CHROMIUM", "/usr/bin/chromium")
REQUIRE_BROWSER = STRICT
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="package")
def chromium() -> str:
    """The Chromium binary, checked before any service is started for nothing."""
    missing = []
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing.append(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("no playwright package (pip install playwright)")
    if missing:
        reason = "; ".join(missing)
        if REQUIRE_BROWSER:
            pytest.fail(f"TRAINQ_TEST_STRICT=1 but {reason}")
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture(scope="package")
def browser(chromium: str) -> Iterator[Any]:
    from playwright.sync_api import expect, sync_playwright

    # Two busy cores run the API, a training worker and the browser: 5 s is too tight.
    expect.set_options(timeout=30_000)

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh context (own sessionStorage, downloads accepted) and page per test. Uncaught
    page errors and console errors are collected on `page.problems`."""
    context = browser.new_context(viewport={"width": 1440, "height": 900}, accept_downloads=True)
    p = context.new_page()
    p.set_default_timeout(30_000)
    problems: list[str] = []
    p.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    p.on(
        "console",
        lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    p.problems = problems
    try:
        yield p
    finally:
        context.close()


@pytest.fixture(scope="package")
def artifacts_dir() -> Path:
    folder = Path(os.environ.get("TRAINQ_ARTIFACTS_DIR") or REPO / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="package")
def redis_server(tmp_path_factory: pytest.TempPathFactory, chromium: str) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="package")
def service(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, redis_server: RedisServer
) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("svc")
    shutil.copytree(data_dir / "mnist-sample", folder / "mnist-sample")
    db = f"sqlite:///{tmp_path_factory.mktemp('db') / 'trainq.db'}"
    svc = Service(data_dir=folder, database_url=db, redis=redis_server)
    yield svc.up(workers=1)
    svc.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """On failure, show what the page reported (tests/conftest.py adds the service logs)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or not hasattr(item, "funcargs"):
        return
    page = item.funcargs.get("page")
    if page is not None and getattr(page, "problems", None):
        report.sections.append(("page problems", "\n".join(page.problems)))

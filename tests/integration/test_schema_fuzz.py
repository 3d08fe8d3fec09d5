"""Schemathesis against the app's own OpenAPI, over real HTTP: positive and negative data,
with and without a key, and (tests/schema_hooks.py) strings holding a NUL byte, numbers of
401 digits, and JSON bodies with a lone surrogate in a string or a key. Zero 5xx and zero
responses that break the documented schema."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service import REPO, STRICT, Service

pytestmark = pytest.mark.slow  # real workers and services: the full run, not --fast

CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance"


def test_no_server_errors_and_no_schema_violations(own_service: Service) -> None:
    """On a service of its own: the jobs the fuzzer submits would keep a shared worker busy."""
    if not own_service.database_url.startswith("sqlite"):
        pytest.skip("the API is the same on both databases: fuzzed once, on SQLite")
    st = Path(sys.executable).with_name("st")
    if not st.exists():
        if STRICT:
            pytest.fail("schemathesis (st) is not installed")
        pytest.skip("schemathesis (st) is not installed")
    for auth in ([], ["-H", f"Authorization: Bearer {own_service.keys[0]}"]):
        proc = subprocess.run(
            [
                str(st), "run", f"{own_service.url}/openapi.json", *auth,
                "--checks", CHECKS, "--mode", "all", "--max-examples", "20",
                "--request-timeout", "10", "--generation-deterministic",
                "--exclude-path", "/jobs/{job_id}/events",  # a stream: followed elsewhere
                "--exclude-path", "/sweeps/{sweep_id}/events",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
            env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.schema_hooks", "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]

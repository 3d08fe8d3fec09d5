"""Model downloads a key leaves open and never reads: past download_max_per_key they are
refused (429), and the other keys' requests go on; each is cut off once its client has
taken nothing for download_send_timeout_s, which frees its slot."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.downloads import stalled_download, succeeded_job
from tests.service import Service, fresh_service, wait_until


def api(tmp_path: Path, env: dict[str, str]) -> contextlib.AbstractContextManager[Service]:
    """The API alone, at most two downloads a key, with `env`."""
    return fresh_service(tmp_path, None, {"TRAINQ_DOWNLOAD_MAX_PER_KEY": "2"} | env)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    with api(tmp_path, {}) as svc:
        yield svc


@pytest.fixture
def impatient(tmp_path: Path) -> Iterator[Service]:
    """One download a key, cut once its client took nothing for a second."""
    env = {"TRAINQ_DOWNLOAD_MAX_PER_KEY": "1", "TRAINQ_DOWNLOAD_SEND_TIMEOUT_S": "1"}
    with api(tmp_path, env) as svc:
        yield svc


def test_a_key_holds_no_more_downloads_open_than_its_limit(service: Service) -> None:
    alice, bob = service.keys
    mine = succeeded_job(service.database_url, alice, 32 << 20)  # past the sockets' buffers
    stalled = [stalled_download(service.port, alice, mine) for _ in range(2)]
    try:
        auth = {"Authorization": f"Bearer {alice}"}
        third = httpx.get(f"{service.url}/jobs/{mine}/model", headers=auth, timeout=30)
        assert third.status_code == 429, third.text[:200]
        assert third.json()["limit"] == "download_max_per_key"
        assert third.headers["Retry-After"]
        theirs = succeeded_job(service.database_url, bob, 1000)
        got = httpx.get(
            f"{service.url}/jobs/{theirs}/model",
            headers={"Authorization": f"Bearer {bob}"},
            timeout=30,
        )
        assert got.status_code == 200 and len(got.content) == 1000
    finally:
        for sock in stalled:
            sock.close()


def received_until_closed(sock: socket.socket) -> int:
    sock.settimeout(30)
    total = 0
    while data := sock.recv(1 << 20):
        total += len(data)
    return total


@pytest.mark.slow
def test_a_download_whose_client_stops_reading_is_cut_and_frees_its_slot(
    impatient: Service,
) -> None:
    service = impatient
    alice = service.keys[0]
    size = 32 << 20
    mine = succeeded_job(service.database_url, alice, size)
    small = succeeded_job(service.database_url, alice, 1000)
    stalled = stalled_download(service.port, alice, mine)
    try:
        auth = {"Authorization": f"Bearer {alice}"}

        def another() -> int:
            return httpx.get(f"{service.url}/jobs/{small}/model", headers=auth).status_code

        wait_until(lambda: another() == 200, 30, "the stalled download to be cut", 0.2)
        assert received_until_closed(stalled) < size
    finally:
        stalled.close()

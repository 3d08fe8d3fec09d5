"""Every Redis connection trainq makes sends TCP keepalive probes, so that a Redis host that
is gone (no reset ever comes) ends even a command blocked for minutes, an idle worker's wait
for a job among them (core.redis_client.keepalive_options)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from cli.local.redis_server import start_embedded
from core.redis_client import (
    KEEPALIVE_IDLE_S,
    KEEPALIVE_INTERVAL_S,
    KEEPALIVE_PROBES,
    connect,
    connect_async,
)
from tests.service import RedisServer


def assert_probes(sock: socket.socket) -> None:
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    if not hasattr(socket, "TCP_KEEPIDLE"):
        pytest.skip("no TCP_KEEPIDLE on this platform")
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE_S
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == KEEPALIVE_INTERVAL_S
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == KEEPALIVE_PROBES


def test_a_connection_probes_a_silent_host(redis_server: RedisServer) -> None:
    r = connect(redis_server.url)
    try:
        conn = r.connection_pool.get_connection()
        try:
            conn.send_command("PING")
            assert conn.read_response() in (b"PONG", "PONG", True)
            assert conn._sock is not None
            assert_probes(conn._sock)
        finally:
            r.connection_pool.release(conn)
    finally:
        r.close()


def test_an_asyncio_connection_probes_a_silent_host(redis_server: RedisServer) -> None:
    async def check() -> None:
        r = connect_async(redis_server.url, longest_block_s=1)
        try:
            conn = await r.connection_pool.get_connection()
            try:
                await conn.send_command("PING")
                await conn.read_response()
                writer = conn._writer
                assert writer is not None
                assert_probes(writer.get_extra_info("socket"))
            finally:
                await r.connection_pool.release(conn)
        finally:
            await r.aclose()

    asyncio.run(check())


def test_the_embedded_servers_unix_socket_connects_without_keepalive(tmp_path: Path) -> None:
    """The README's default path: the embedded redis-server on a unix socket, which refuses
    keepalive arguments; both clients connect to it."""
    url, started = start_embedded(tmp_path)
    assert started and url.startswith("unix://")
    r = connect(url)
    try:
        assert r.ping()

        async def ping() -> bool:
            a = connect_async(url, longest_block_s=1)
            try:
                return bool(await a.ping())
            finally:
                await a.aclose()

        assert asyncio.run(ping())
    finally:
        r.shutdown(nosave=True)
        r.close()

"""The wire proxy itself: each fault does what it says to a real redis-server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from tests.service import RedisServer
from tests.wire import WireProxy


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[WireProxy]:
    p = WireProxy(redis_server.port).start()
    yield p
    p.close()


def _client(p: WireProxy) -> Redis:
    return Redis(port=p.port, socket_timeout=1, socket_connect_timeout=1)


def test_forwards(proxy: WireProxy) -> None:
    with _client(proxy) as r:
        r.set("wire:k", "v")
        assert r.get("wire:k") == b"v"


def test_drop_reply_runs_the_command_and_loses_its_answer(
    proxy: WireProxy, redis_server: RedisServer
) -> None:
    direct = redis_server.client()
    direct.delete("wire:n")
    proxy.drop_reply(b"INCR", 1)
    with Redis(port=proxy.port, socket_timeout=1, retry=Retry(NoBackoff(), 0)) as r:
        with pytest.raises((RedisConnectionError, RedisTimeoutError)):
            r.incr("wire:n")
        assert direct.get("wire:n") == b"1"  # it ran
        assert proxy.dropped == 1
        assert r.incr("wire:n") == 2  # the next one goes through
    direct.close()


def test_partition_times_out_then_heals(proxy: WireProxy) -> None:
    with _client(proxy) as r:
        r.ping()
        proxy.partition()
        with pytest.raises((RedisTimeoutError, RedisConnectionError)):
            Redis(port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)).ping()
        proxy.heal()
        assert r.ping()


def test_cut_resets_connections_in_flight(proxy: WireProxy) -> None:
    r = Redis(port=proxy.port, socket_timeout=5, retry=Retry(NoBackoff(), 0))
    errors: list[Exception] = []

    def wait() -> None:
        try:
            r.blpop(["wire:never"], timeout=3)
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)
    proxy.cut()
    t.join(5)
    assert errors and isinstance(errors[0], RedisConnectionError)
    r.close()

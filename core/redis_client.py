"""The Redis client every trainq process uses: bounded connect and read timeouts, and a
health check before an idle connection is used again.
See docs/jobs.md ("Redis away")."""

from __future__ import annotations

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 5.0  # a command of ours answers in milliseconds
HEALTH_CHECK_INTERVAL_S = 30  # an idle connection is pinged before it is used again


def connect(url: str) -> Redis:
    return Redis.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=READ_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
    )


def connect_async(url: str, *, longest_block_s: float) -> AsyncRedis:
    """The asyncio client; its commands may block for `longest_block_s` (XREAD BLOCK), so
    its read timeout is that much longer."""
    return AsyncRedis.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=longest_block_s + READ_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
    )


def use_read_timeout(r: Redis, seconds: float) -> None:
    """The read timeout of the connections `r` makes from now on. After a fork the pool
    makes new connections, so a forked child can set its own."""
    r.connection_pool.connection_kwargs["socket_timeout"] = seconds

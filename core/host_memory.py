"""How much memory this process may still use: the kernel's MemAvailable, or less where a
memory cgroup (v2, or v1) limits this process or any group above it, as in a container, a
systemd slice or a Kubernetes pod. A group's reclaimable page cache (inactive files) counts as
free, as the kernel's MemAvailable counts it."""

from __future__ import annotations

from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def memory() -> tuple[int, int] | None:
    """(total, available) in bytes for this process; None where the kernel does not say.
    Under a cgroup limit, total is the tightest limit and available what is left under it."""
    info = _meminfo()
    if info is None:
        return None
    total, available = info
    for limit, room in _cgroup_limits():
        if room < available:
            total, available = min(total, limit), room
    return total, available


def _meminfo() -> tuple[int, int] | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return (
            int(fields["MemTotal"].split()[0]) * 1024,
            int(fields["MemAvailable"].split()[0]) * 1024,
        )
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _cgroup_limits() -> list[tuple[int, int]]:
    """(limit, room left) of each memory cgroup with a limit, from this process's up."""
    try:
        lines = Path("/proc/self/cgroup").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "" and (CGROUP / "cgroup.controllers").exists():
            out += _limits(CGROUP, path, "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            mount = CGROUP / "memory"
            out += _limits(
                mount,
                path,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            )
    return out


def _limits(
    mount: Path, path: str, limit_file: str, usage_file: str, inactive: str
) -> list[tuple[int, int]]:
    folder = mount / path.strip("/")
    if not folder.is_dir():  # a container sees its own group as the mount's root
        folder = mount
    out = []
    while True:
        found = _limit(folder, limit_file, usage_file, inactive)
        if found is not None:
            out.append(found)
        if folder == mount or mount not in folder.parents:
            return out
        folder = folder.parent


def _limit(folder: Path, limit_file: str, usage_file: str, inactive: str) -> tuple[int, int] | None:
    try:
        text = (folder / limit_file).read_text().strip()
        if text == "max" or int(text) >= UNLIMITED:
            return None
        limit, used = int(text), int((folder / usage_file).read_text())
        stat = dict(
            line.split(" ", 1) for line in (folder / "memory.stat").read_text().splitlines()
        )
        reclaimable = int(stat.get(inactive, "0"))
    except (OSError, ValueError):  # ValueError: a line or number not as the kernel writes it
        return None
    return limit, limit - max(0, used - reclaimable)

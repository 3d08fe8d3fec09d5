"""How much memory a request costs a service process: its peak RSS, read from /proc."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def _status_mib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) >> 10
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def peak_growth_mib(pid: int, act: Callable[[], T]) -> tuple[T, int]:
    """What `act` returns, and how far process `pid`'s peak RSS rose above its RSS before
    `act`, in MiB. Writing 5 to clear_refs resets the peak (VmHWM) to the current RSS, so
    earlier requests do not hide this one."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = _status_mib(pid, "VmRSS")
    out = act()
    return out, _status_mib(pid, "VmHWM") - before

"""What a worker takes as free memory under memory cgroups (core.host_memory): the tightest
limit of its group and those above it, v2 and v1, reclaimable page cache counted as free."""

from __future__ import annotations

from pathlib import Path

from core import host_memory

GIB = 1 << 30


def group(folder: Path, limit: str, used: int, inactive: int, v1: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if v1:
        (folder / "memory.limit_in_bytes").write_text(limit)
        (folder / "memory.usage_in_bytes").write_text(str(used))
        (folder / "memory.stat").write_text(f"cache 5\ntotal_inactive_file {inactive}\n")
    else:
        (folder / "memory.max").write_text(limit)
        (folder / "memory.current").write_text(str(used))
        (folder / "memory.stat").write_text(f"anon 1\ninactive_file {inactive}\n")


def test_a_limit_above_the_own_group_counts_with_its_page_cache_free(tmp_path: Path) -> None:
    group(tmp_path / "kubepods" / "pod1", str(4 * GIB), 3 * GIB, GIB)
    group(tmp_path / "kubepods" / "pod1" / "worker", "max", 3 * GIB, GIB)
    group(tmp_path / "kubepods", str(64 * GIB), 10 * GIB, 0)
    found = host_memory._limits(
        tmp_path, "/kubepods/pod1/worker", "memory.max", "memory.current", "inactive_file"
    )
    assert sorted(found) == [(4 * GIB, 2 * GIB), (64 * GIB, 54 * GIB)]


def test_cgroup_v1_limits_and_no_limit(tmp_path: Path) -> None:
    mount = tmp_path / "memory"
    group(mount / "docker" / "abc", str(2 * GIB), GIB, GIB // 2, v1=True)
    group(mount / "docker", "9223372036854771712", 5 * GIB, 0, v1=True)
    found = host_memory._limits(
        mount,
        "/docker/abc",
        "memory.limit_in_bytes",
        "memory.usage_in_bytes",
        "total_inactive_file",
    )
    assert found == [(2 * GIB, 2 * GIB - GIB // 2)]


def test_a_container_sees_its_own_group_as_the_root(tmp_path: Path) -> None:
    group(tmp_path, str(GIB), GIB // 4, 0)
    found = host_memory._limits(
        tmp_path, "/host/path/unseen", "memory.max", "memory.current", "inactive_file"
    )
    assert found == [(GIB, 3 * GIB // 4)]


def test_this_host_says_something_sane() -> None:
    found = host_memory.memory()
    assert found is None or 0 <= found[1] <= found[0]

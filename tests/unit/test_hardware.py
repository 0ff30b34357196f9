"""``usable_cores``: the CPU affinity bounded by the cgroup's CPU quota (a pod's ``limits.cpu``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ragserve.hardware import cgroup_cpu_quota, usable_cores


def affinity() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "files, quota",
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "200000 100000\n"}, 2.0),
        ({"cpu.max": "50000 100000\n"}, 0.5),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "garbage\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "0\n"}, None),
        ({}, None),
    ],
)
def test_the_cgroup_quota_is_read_from_v2_or_v1(tmp_path: Path, files: dict[str, str], quota: float | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(str(tmp_path)) == quota


def test_a_quota_bounds_the_cores_rounded_down_to_at_least_one(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a CPU: still one thread
    assert usable_cores(str(tmp_path)) == 1
    (tmp_path / "cpu.max").write_text(f"{(affinity() + 5) * 100000} 100000\n")  # above the affinity
    assert usable_cores(str(tmp_path)) == affinity()
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cores(str(tmp_path)) == affinity()
    (tmp_path / "cpu.max").write_text("190000 100000\n")  # 1.9 CPUs of time: one thread
    assert usable_cores(str(tmp_path)) == 1
    if affinity() >= 2:
        (tmp_path / "cpu.max").write_text("200000 100000\n")
        assert usable_cores(str(tmp_path)) == 2

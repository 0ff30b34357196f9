"""What this process may use of the machine."""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cores(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """Cores this process may run on: its CPU affinity, bounded by its cgroup's CPU quota (a
    Kubernetes pod's ``limits.cpu`` sets a quota, not an affinity: a pod limited to 2 CPUs on a
    64-core node sees all 64 in its affinity, and 64 torch threads or encode workers in 2 CPUs of
    time would spend it waiting for each other). A fractional quota rounds down (at least one), as
    Go's automaxprocs does: a thread more than the quota pays for is throttled. Under Ray,
    OMP_NUM_THREADS is set to the actor's ``num_cpus`` (often 1), so model code sets torch's thread
    count from this instead."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = max(1, os.cpu_count() or 1)
    quota = cgroup_cpu_quota(cgroup_root)
    return max(1, min(cores, math.floor(quota))) if quota is not None else cores


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs of time this process's cgroup may use (quota / period), or None when unlimited or
    unknown. cgroup v2's ``cpu.max`` ("max 100000" or "200000 100000"), else v1's
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: unlimited)."""
    base = Path(root)
    try:
        quota, period = (base / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        q = int((base / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((base / "cpu" / "cpu.cfs_period_us").read_text())
        return None if q <= 0 or p <= 0 else q / p
    except (OSError, ValueError):
        return None


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the operating system (glibc's ``malloc_trim``).

    A model's activations for a batch of long documents are freed after the batch, but glibc keeps
    the pages for reuse: the Embedder replica held ~300 MiB more after an ingest than before it
    (docs/benchmarks.md, memory). Trimming costs 10-20 ms, well under 1% of the encoding of a
    batch of 128 chunks on a CPU. False where the C library has no ``malloc_trim``."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False

"""What this process may use of the machine."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on. Under Ray, OMP_NUM_THREADS is set to the actor's ``num_cpus``
    (often 1), so model code sets torch's thread count from this instead."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


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

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

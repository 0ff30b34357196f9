"""A serving process's long-lived heap, kept out of the cyclic garbage collector's full passes.

CPython's full (generation 2) collection walks every container object the process holds. A replica
holds ~0.5 M of them once its libraries, models and application are loaded (torch, transformers,
pydantic's schemas, FastAPI's routes), and a full pass over those took 0.5-1.0 s of the event loop on
this project's 2-core machine: a 1 MB document sent to ``/index`` made enough new objects to start
one or two, and ``/health`` waited 0.5-1.2 s behind each (docs/benchmarks.md, "Full collections").
Nothing of that startup heap ever becomes garbage, so once a process is ready :func:`settle`
collects once and moves what is left to the permanent generation (``gc.freeze``): later full passes
walk only what was made after it. Objects frozen are still freed by reference counting; only a
reference cycle among them would never be reclaimed, which is why this is called once, when the
process has made what it keeps for its life, and never from a test process that builds and drops
applications. ``RAGSERVE_FREEZE_HEAP=0`` in a process's environment turns it off (to compare, or to
rule it out).
"""

from __future__ import annotations

import gc
import logging
import os
import time

log = logging.getLogger(__name__)


def settle(role: str) -> int:
    """Collect, then freeze every object left (the process's startup heap); the number frozen so
    far (0: turned off). Call once, at the end of a serving process's start (``role`` names it in
    the log)."""
    if os.environ.get("RAGSERVE_FREEZE_HEAP", "1") == "0":
        return 0
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%s: %d startup objects frozen out of full collections in %.2fs", role, frozen, time.perf_counter() - t0)
    return frozen

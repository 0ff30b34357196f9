"""Waiting in async tests for a state another task or thread produces (``asyncio.timeout`` is 3.11+)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0, every_s: float = 0.02) -> None:
    """Return once ``check()`` is true; fail the test if it is still false after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"still not true after {timeout_s} s"
        await asyncio.sleep(every_s)

"""Waiting with a time limit without losing a cancellation.

``asyncio.wait_for`` before Python 3.12 returns the awaited result when the task is cancelled just
as that awaitable ends (the cancel lands after the inner wait finished but before the task ran
again): the ``CancelledError`` is swallowed. A background loop stopped by ``task.cancel()`` then
runs on, and the ``stop()`` that awaits it waits for ever; a usage meter whose limited key woke it
while its application shut down hung that way (found under CPU contention: 3 stops of 5).
``asyncio.timeout`` has no such race but needs 3.11; these use ``asyncio.wait``, which never
swallows a cancellation of its caller, on every supported Python.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

_T = TypeVar("_T")


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` has passed; whether it is set. A cancellation
    of the caller is always raised, whenever it arrives."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=max(0.0, timeout_s))
    finally:
        waiter.cancel()  # a no-op once it is done
    return event.is_set()


async def within(aw: Awaitable[_T], timeout_s: float) -> _T:
    """``aw``'s result, or ``asyncio.TimeoutError`` once ``timeout_s`` has passed (``aw`` is then
    cancelled and waited for). A cancellation of the caller cancels ``aw`` and is raised, even
    when ``aw`` has just ended."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout_s))
    except BaseException:
        task.cancel()
        await asyncio.wait({task})  # it is not running once this returns (a second cancel still ends the wait)
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task})  # raises only the caller's own cancellation, never the task's
        if task.cancelled():
            raise asyncio.TimeoutError
    return task.result()  # it ended on its own (even while being cancelled): its outcome stands


async def cancel_and_wait(task: asyncio.Task[_T]) -> None:
    """Cancel ``task`` and wait until it has ended. Raises what it raised if it ended another way
    than cancelled, and the caller's own cancellation (``with suppress(CancelledError): await
    task`` would swallow that one too)."""
    task.cancel()
    await wait_ended(task)


async def wait_ended(task: asyncio.Task[_T]) -> None:
    """Wait until ``task`` has ended; raise what it raised unless it was cancelled. Only the
    caller's own cancellation interrupts the wait, and it is raised."""
    await asyncio.wait({task})
    if not task.cancelled():
        task.result()

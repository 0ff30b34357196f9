"""``ragserve.aio``: waits with a time limit that never lose their caller's cancellation.

The race: a task waiting with a limit is cancelled just as what it waits for ends. Each test sweeps
the moment of the cancel over the next few turns of the event loop after the wake-up, so one of
them lands in the window where ``asyncio.wait_for`` (before Python 3.12) returns instead of raising.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from ragserve.aio import wait_event, within
from ragserve.service.usage import RequestUsage, UsageLedger, UsageMeter, UsageService
from ragserve.telemetry import NullTelemetry

TURNS = range(8)  # loop turns between the wake-up and the cancel


async def _stops_when_cancelled(wait_once, turns: int) -> bool:
    """A loop ``while True: await wait_once(event)``; set its event, let ``turns`` loop turns pass,
    cancel it: whether it ended (cancelled) within 2 s."""
    event = asyncio.Event()

    async def loop() -> None:
        while True:
            await wait_once(event)
            event.clear()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)  # it is waiting
    event.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=2)
        return False
    return task.cancelled()


@pytest.mark.parametrize("turns", TURNS)
async def test_wait_event_never_loses_a_cancellation(turns: int) -> None:
    assert await _stops_when_cancelled(lambda e: wait_event(e, 30), turns)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="asyncio.wait_for keeps the cancellation from 3.12")
async def test_the_sweep_finds_the_race_that_wait_for_has_before_3_12() -> None:
    """The sweep above is sharp enough: the pattern it replaces loses the cancel at one of its turns."""
    naive = [await _stops_when_cancelled(lambda e: asyncio.wait_for(e.wait(), 30), t) for t in TURNS]
    assert not all(naive), naive


async def test_wait_event_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5) is True
    assert await wait_event(event, 0) is True  # already set: no wait at all
    assert await wait_event(asyncio.Event(), -1) is False  # a negative limit is no wait


async def test_within_returns_raises_and_times_out() -> None:
    async def value() -> int:
        await asyncio.sleep(0)
        return 7

    async def boom() -> None:
        raise ValueError("inner")

    assert await within(value(), 5) == 7
    with pytest.raises(ValueError, match="inner"):
        await within(boom(), 5)
    cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(asyncio.TimeoutError):
        await within(slow(), 0.02)
    assert cancelled.is_set()  # the inner work was cancelled and waited for


@pytest.mark.parametrize("turns", TURNS)
async def test_within_never_loses_a_cancellation(turns: int) -> None:
    async def once(event: asyncio.Event) -> None:
        await within(event.wait(), 30)

    assert await _stops_when_cancelled(once, turns)


async def test_within_cancels_its_work_when_its_caller_is_cancelled() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.create_task(within(work(), 30))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert cancelled.is_set()  # ended before the caller's cancel was raised, not some turns later


@pytest.mark.parametrize("turns", TURNS)
async def test_a_usage_meter_woken_as_it_stops_still_stops(tmp_path, turns: int) -> None:
    """The hang found: a limited key's request wakes the meter's loop as the application stops.
    ``stop()`` cancels the loop and waits for it; the wake must not eat the cancel."""
    service = UsageService(UsageLedger(tmp_path / "u.sqlite3"))
    meter = UsageMeter(service, NullTelemetry(), lambda text: len(text.split()), interval_s=30)
    await meter.start()
    await asyncio.sleep(0.01)
    limited = RequestUsage("k", limited=True)
    limited.indexes = ("docs",)
    await meter.finish(limited, failed=False)  # urgent: sets the loop's wake-up
    for _ in range(turns):
        await asyncio.sleep(0)
    await asyncio.wait_for(meter.stop(), 5)
    (row,) = service.ledger.report(0, 4e9).data
    assert (row.key, row.index, row.requests) == ("k", "docs", 1)  # counted once, by the loop or the stop

"""The usage ledger and limiter (``ragserve.service.usage``): hourly buckets, reports, persistence,
the minute and day windows, atomic admission under concurrency, and the meter's buffer."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest

from ragserve.service.access import Principal, Role
from ragserve.service.usage import (
    Decision,
    KeyLimits,
    RequestUsage,
    Usage,
    UsageLedger,
    UsageMeter,
    UsageService,
    scoped_report,
)
from ragserve.telemetry import NullTelemetry

T0 = datetime(2026, 3, 1, 10, 0, 5, tzinfo=UTC).timestamp()  # 10:00:05 UTC


def test_buckets_and_report_per_key_and_index(tmp_path) -> None:
    ledger = UsageLedger(tmp_path / "usage.sqlite3")
    ledger.record([Usage("team-a", ("docs",), requests=1, prompt_tokens=10, completion_tokens=5)], now=T0)
    ledger.record([Usage("team-a", ("docs",), requests=1, embedding_tokens=7)], now=T0 + 60)
    ledger.record([Usage("team-a", ("docs", "faq"), requests=1, prompt_tokens=3)], now=T0 + 3600)  # next hour
    ledger.record([Usage("team-b", (), requests=2, documents=1, bytes=100)], now=T0)
    report = ledger.report(T0 - 5, T0 + 7200)
    rows = {(r.key, r.index): r for r in report.data}
    assert set(rows) == {("team-a", "docs"), ("team-a", "faq"), ("team-b", "")}
    docs = rows[("team-a", "docs")]
    assert (docs.requests, docs.prompt_tokens, docs.completion_tokens, docs.embedding_tokens) == (3, 13, 5, 7)
    assert rows[("team-a", "faq")].requests == 1 and rows[("team-a", "faq")].prompt_tokens == 3
    assert (rows[("team-b", "")].documents, rows[("team-b", "")].bytes) == (1, 100)
    totals = {t.key: t for t in report.totals}
    assert totals["team-a"].requests == 3 and totals["team-a"].prompt_tokens == 13  # the two-index request once
    # hourly: a period of the first hour only leaves the second out
    first = ledger.report(T0, T0 + 1)
    assert {(r.key, r.index): r.requests for r in first.data}[("team-a", "docs")] == 2
    assert first.since == int(T0 - 5) and first.until == int(T0 - 5) + 3600


def test_kept_across_reopen(tmp_path) -> None:
    path = tmp_path / "usage.sqlite3"
    ledger = UsageLedger(path)
    ledger.record([Usage("k", ("i",), requests=4, completion_tokens=9)], now=T0)
    ledger.admit("k", KeyLimits(requests_per_minute=3), now=T0)
    ledger.close()
    again = UsageLedger(path)
    assert again.report(T0, T0 + 1).data[0].completion_tokens == 9
    # the minute window survives too: two more, then refused
    assert again.admit("k", KeyLimits(requests_per_minute=3), now=T0 + 1).allowed
    assert again.admit("k", KeyLimits(requests_per_minute=3), now=T0 + 2).allowed
    assert not again.admit("k", KeyLimits(requests_per_minute=3), now=T0 + 3).allowed


def test_requests_per_minute_is_a_fixed_utc_minute(tmp_path) -> None:
    ledger = UsageLedger(tmp_path / "u.sqlite3")
    limits = KeyLimits(requests_per_minute=2)
    first = ledger.admit("k", limits, now=T0)
    assert first.allowed and first.requests is not None
    assert (first.requests.limit, first.requests.remaining) == (2, 1)
    assert first.requests.reset_s == pytest.approx(55)
    assert ledger.admit("k", limits, now=T0 + 1).allowed
    refused = ledger.admit("k", limits, now=T0 + 2)
    assert not refused.allowed and refused.exceeded == "requests"
    assert refused.requests is not None and refused.requests.remaining == 0
    assert refused.retry_after_s == 53  # until 10:01:00
    assert ledger.admit("other", limits, now=T0 + 2).allowed  # per key
    assert ledger.admit("k", limits, now=T0 + 55).allowed  # the next minute
    assert not ledger.admit("k", KeyLimits(requests_per_minute=1), now=T0 + 56).allowed


def test_tokens_per_day_counts_what_was_recorded_today(tmp_path) -> None:
    ledger = UsageLedger(tmp_path / "u.sqlite3")
    limits = KeyLimits(tokens_per_day=100)
    ledger.record([Usage("k", ("a",), prompt_tokens=40, completion_tokens=20)], now=T0 - 86400)  # yesterday
    ok = ledger.admit("k", limits, now=T0)
    assert ok.allowed and ok.tokens is not None and ok.tokens.remaining == 100
    ledger.record([Usage("k", ("a", "b"), prompt_tokens=50, completion_tokens=30, embedding_tokens=19)], now=T0)
    near = ledger.admit("k", limits, now=T0 + 1)
    assert near.allowed and near.tokens is not None and near.tokens.remaining == 1  # 99 used: counted once
    ledger.record([Usage("k", (), embedding_tokens=1)], now=T0 + 2)
    refused = ledger.admit("k", limits, now=T0 + 3)
    assert not refused.allowed and refused.exceeded == "tokens"
    midnight = datetime(2026, 3, 2, tzinfo=UTC).timestamp()
    assert refused.retry_after_s == int(midnight - (T0 + 3))
    assert ledger.admit("k", limits, now=midnight).allowed  # a new UTC day


def test_refused_by_tokens_does_not_use_a_request(tmp_path) -> None:
    ledger = UsageLedger(tmp_path / "u.sqlite3")
    ledger.record([Usage("k", (), prompt_tokens=10)], now=T0)
    both = KeyLimits(requests_per_minute=1, tokens_per_day=10)
    assert ledger.admit("k", both, now=T0).exceeded == "tokens"
    assert ledger.admit("k", KeyLimits(requests_per_minute=1), now=T0).allowed


def test_concurrent_admits_never_exceed_the_limit(tmp_path) -> None:
    ledger = UsageLedger(tmp_path / "u.sqlite3")
    limits = KeyLimits(requests_per_minute=25)
    results: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(10):
            d = ledger.admit("k", limits, now=T0)
            with lock:
                results.append(d.allowed)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 80 and sum(results) == 25


def test_two_ledgers_on_one_file_share_the_window(tmp_path) -> None:
    """Two processes (or a restarted owner beside a stopping one) on the same file: SQLite's
    BEGIN IMMEDIATE serialises them, so the count is one."""
    a, b = UsageLedger(tmp_path / "u.sqlite3"), UsageLedger(tmp_path / "u.sqlite3")
    limits = KeyLimits(requests_per_minute=3)
    outcomes = [x.admit("k", limits, now=T0).allowed for x in (a, b, a, b, a)]
    assert outcomes == [True, True, True, False, False]


def test_a_scoped_admin_sees_only_its_indexes(tmp_path) -> None:
    ledger = UsageLedger(tmp_path / "u.sqlite3")
    ledger.record(
        [
            Usage("a", ("team-docs",), requests=2, prompt_tokens=5),
            Usage("a", ("secret",), requests=1),
            Usage("b", ("team-faq", "secret"), requests=1, prompt_tokens=4),
            Usage("c", (), requests=9),
        ],
        now=T0,
    )
    report = ledger.report(T0, T0 + 1)
    scoped = scoped_report(report, Principal(Role.ADMIN, ("team-*",)))
    assert {(r.key, r.index) for r in scoped.data} == {("a", "team-docs"), ("b", "team-faq")}
    assert {t.key: (t.requests, t.prompt_tokens) for t in scoped.totals} == {"a": (2, 5), "b": (1, 4)}
    whole = scoped_report(report, Principal(Role.ADMIN, ("*",)))
    assert whole == report and {t.key: t.requests for t in whole.totals}["c"] == 9


class FlakyBackend:
    def __init__(self, service: UsageService):
        self.service = service
        self.fail = True
        self.calls = 0

    async def admit(self, key: str, limits: KeyLimits) -> Decision:
        return await self.service.admit(key, limits)

    async def record(self, batch: list[Usage]) -> None:
        self.calls += 1
        if self.fail:
            raise ConnectionError("owner unreachable")
        await self.service.record(batch)

    async def report(self, since: float, until: float):  # type: ignore[no-untyped-def]
        return await self.service.report(since, until)


def test_the_meter_buffers_merges_and_keeps_what_it_could_not_send(tmp_path) -> None:
    service = UsageService(UsageLedger(tmp_path / "u.sqlite3"))
    backend = FlakyBackend(service)
    meter = UsageMeter(backend, NullTelemetry(), lambda text: len(text.split()), interval_s=30)

    async def run() -> None:
        for _ in range(3):
            r = RequestUsage("k")
            r.indexes = ("docs",)
            r.chat(10, 2)
            r.query_texts.append("three word query")
            await meter.finish(r, failed=False)
        failed = RequestUsage("k")
        failed.indexes = ("no-such-index",)
        await meter.finish(failed, failed=True)
        await meter.flush()  # fails: kept
        backend.fail = False
        await meter.stop()  # sends what is left

    asyncio.run(run())
    rows = {(r.key, r.index): r for r in service.ledger.report(0, 4e9).data}
    assert set(rows) == {("k", "docs"), ("k", "")}  # a failed request counts on no index
    assert rows[("k", "docs")].requests == 3
    assert (rows[("k", "docs")].prompt_tokens, rows[("k", "docs")].embedding_tokens) == (30, 9)
    assert rows[("k", "")].requests == 1
    assert backend.calls == 2


def _meter(tmp_path, backend_class: type[FlakyBackend]) -> tuple[UsageService, FlakyBackend, UsageMeter]:
    service = UsageService(UsageLedger(tmp_path / "u.sqlite3"))
    backend = backend_class(service)
    return service, backend, UsageMeter(backend, NullTelemetry(), lambda text: len(text.split()), interval_s=30)


async def _count_chat(meter: UsageMeter, prompt: int, completion: int) -> None:
    r = RequestUsage("k")
    r.indexes = ("docs",)
    r.chat(prompt, completion)
    await meter.finish(r, failed=False)


class HeldBackend(FlakyBackend):
    """An owner whose record call answers only once released (and then fails while ``fail``)."""

    def __init__(self, service: UsageService):
        super().__init__(service)
        self.release = asyncio.Event()

    async def record(self, batch: list[Usage]) -> None:
        self.calls += 1
        await self.release.wait()
        if self.fail:
            raise ConnectionError("owner unreachable")
        await self.service.record(batch)


@pytest.mark.parametrize("answer", ["recorded", "failed"])
def test_a_flush_cancelled_mid_way_counts_its_rows_once(tmp_path, answer: str) -> None:
    """A caller cancelled during a flush (the replica stopping, a client leaving GET /usage) stops
    waiting; the send runs on, and its answer decides: recorded (not sent again, which would count
    it twice) or failed (kept for the next flush)."""
    service, backend, meter = _meter(tmp_path, HeldBackend)
    backend.fail = answer == "failed"

    async def run() -> None:
        await _count_chat(meter, 7, 3)
        flushing = asyncio.create_task(meter.flush())
        await asyncio.sleep(0.05)
        flushing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flushing
        backend.release.set()
        await asyncio.sleep(0.05)
        backend.fail = False
        await meter.stop()

    asyncio.run(run())
    (row,) = service.ledger.report(0, 4e9).data
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, 7, 3)
    assert backend.calls == (1 if answer == "recorded" else 2)


def test_a_stop_gives_up_on_a_send_that_never_answers(tmp_path) -> None:
    service, backend, meter = _meter(tmp_path, HeldBackend)

    async def run() -> None:
        await meter.finish(RequestUsage("k"), failed=False)
        await asyncio.wait_for(meter.stop(timeout_s=0.1), 5)

    asyncio.run(run())
    assert backend.calls == 1 and service.ledger.report(0, 4e9).data == []


class FailOnceHeldBackend(HeldBackend):
    """The first record call waits to be released and then fails; later ones record."""

    async def record(self, batch: list[Usage]) -> None:
        self.calls += 1
        if self.calls == 1:
            await self.release.wait()
            raise ConnectionError("owner unreachable")
        await self.service.record(batch)


def test_a_send_that_fails_while_the_meter_stops_is_sent_again(tmp_path) -> None:
    service, backend, meter = _meter(tmp_path, FailOnceHeldBackend)

    async def run() -> None:
        await _count_chat(meter, 5, 1)
        flushing = asyncio.create_task(meter.flush())  # the send is under way when stop() begins
        await asyncio.sleep(0.02)
        stopping = asyncio.create_task(meter.stop(timeout_s=5))
        await asyncio.sleep(0.02)
        backend.release.set()  # it fails now: its rows go back to the buffer, and stop sends them
        await stopping
        await flushing

    asyncio.run(run())
    (row,) = service.ledger.report(0, 4e9).data
    assert (row.requests, row.prompt_tokens) == (1, 5) and backend.calls == 2


def test_a_stop_whose_caller_is_cancelled_raises_the_cancel(tmp_path) -> None:
    _, _, meter = _meter(tmp_path, HeldBackend)

    async def run() -> None:
        await meter.start()
        await meter.finish(RequestUsage("k"), failed=False)
        stopping = asyncio.create_task(meter.stop(timeout_s=30))  # its send never answers
        await asyncio.sleep(0.05)
        stopping.cancel()
        done, _ = await asyncio.wait({stopping}, timeout=5)
        assert done and stopping.cancelled()

    asyncio.run(run())

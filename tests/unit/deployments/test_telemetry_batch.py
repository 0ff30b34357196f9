"""Counter increments summed by ``CounterBatch`` reach their counters whole: by counter and tag
set, from its own thread within a flush period, and on ``flush``/``close``."""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any

from ragserve.deployments.telemetry import CounterBatch


class RecordingCounter:
    def __init__(self) -> None:
        self.calls: list[tuple[float, dict[str, str]]] = []
        self._lock = threading.Lock()

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        with self._lock:
            self.calls.append((value, dict(tags or {})))

    def totals(self) -> dict[tuple[tuple[str, str], ...], float]:
        out: dict[tuple[tuple[str, str], ...], float] = {}
        for value, tags in self.calls:
            key = tuple(sorted(tags.items()))
            out[key] = out.get(key, 0) + value
        return out


def _wait(predicate: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_increments_are_summed_by_counter_and_tags_and_flushed_once() -> None:
    batch = CounterBatch(flush_s=3600)  # the thread never fires: flush by hand
    a, b = RecordingCounter(), RecordingCounter()
    for _ in range(100):
        batch.inc(a, tags={"route": "/retrieve", "status": "200"})
        batch.inc(a, 2, tags={"status": "200", "route": "/retrieve"})  # the same tags, in another order
        batch.inc(a, tags={"route": "/query", "status": "200"})
        batch.inc(b)
    assert a.calls == [] and b.calls == []  # nothing recorded per increment
    batch.flush()
    retrieve, query = (("route", "/retrieve"), ("status", "200")), (("route", "/query"), ("status", "200"))
    assert a.totals() == {retrieve: 300, query: 100}
    assert len(a.calls) == 2 and b.calls == [(100, {})]
    batch.flush()  # nothing new: nothing recorded
    assert len(a.calls) == 2 and len(b.calls) == 1
    batch.close()


def test_the_thread_flushes_within_its_period_and_loses_nothing_under_concurrent_increments() -> None:
    batch = CounterBatch(flush_s=0.05)
    counter = RecordingCounter()

    def work() -> None:
        for i in range(2_000):
            batch.inc(counter, tags={"kind": str(i % 3)})

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _wait(lambda: sum(counter.totals().values()) == 8_000)
    assert counter.totals() == {(("kind", "0"),): 2_668, (("kind", "1"),): 2_668, (("kind", "2"),): 2_664}
    assert len(counter.calls) < 8_000  # summed, not one record an increment
    batch.close()


def test_close_flushes_what_is_left_and_the_thread_ends_with_its_batch() -> None:
    counter = RecordingCounter()
    batch = CounterBatch(flush_s=3600)
    batch.inc(counter, 5)
    batch.close()
    assert counter.calls == [(5, {})]

    before = {t for t in threading.enumerate() if t.name == "metric-counter-flush"}
    dropped = CounterBatch(flush_s=0.02)
    del dropped
    gc.collect()
    assert _wait(lambda: {t for t in threading.enumerate() if t.name == "metric-counter-flush"} <= before)


class RefusingCounter(RecordingCounter):
    """A counter that refuses one value, as Ray's may refuse what it does not expect."""

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        if value == 13:
            raise RuntimeError("refused")
        super().inc(value, tags)


def test_a_value_ray_would_refuse_is_dropped_and_a_tag_made_str_never_raising() -> None:
    """Metrics never fail a request: an upstream's error type 503 as a tag, or a negative token
    count, must neither raise to the caller nor reach Ray."""
    batch = CounterBatch(flush_s=3600)
    counter = RecordingCounter()
    for bad in (-1, float("nan"), float("inf"), "3", None, 0):
        batch.inc(counter, bad)  # type: ignore[arg-type]
    batch.inc(counter, tags={"kind": 503})  # type: ignore[dict-item]
    batch.close()
    assert counter.calls == [(1, {"kind": "503"})]


def test_a_counter_that_fails_neither_loses_the_others_nor_ends_the_thread(caplog) -> None:
    batch = CounterBatch(flush_s=0.02)
    refusing, good = RefusingCounter(), RecordingCounter()
    batch.inc(refusing, 13)
    batch.inc(good, 2)
    with caplog.at_level(logging.ERROR, logger="ragserve.telemetry"):
        assert _wait(lambda: good.calls == [(2, {})])
        assert _wait(lambda: "refused" in caplog.text)
    batch.inc(refusing, 1)
    batch.inc(good, 3)  # a later flush of the same thread still goes out
    assert _wait(lambda: good.calls == [(2, {}), (3, {})] and refusing.calls == [(1, {})])
    batch.close()


class _FakeMetrics:
    """``ray.serve.metrics`` as ``ServeTelemetry`` builds on it, recording what reaches it."""

    def __init__(self) -> None:
        self.counters: dict[str, RecordingCounter] = {}
        self.observed: dict[str, list[float]] = {}
        fake = self

        class Counter(RecordingCounter):
            def __init__(self, name: str, description: str = "", tag_keys: Any = ()) -> None:
                super().__init__()
                fake.counters[name] = self

        class Histogram:
            def __init__(self, name: str, description: str = "", boundaries: Any = (), tag_keys: Any = ()) -> None:
                self.name = name

            def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
                fake.observed.setdefault(self.name, []).append(value)

        self.Counter = Counter
        self.Histogram = Histogram


def test_serve_telemetry_counts_through_its_batch(monkeypatch) -> None:
    from ragserve.deployments import clients, telemetry

    fake = _FakeMetrics()
    monkeypatch.setattr(telemetry, "metrics", fake)
    monkeypatch.setattr(clients, "metrics", fake, raising=False)
    tel = telemetry.ServeTelemetry()
    for _ in range(3):
        tel.request("/retrieve", 200, "rag", "")
    tel.usage("team-a", "kb", "prompt_tokens", 120)
    tel.usage("team-a", "kb", "prompt_tokens", 30)
    tel.answer_cache("hit")
    tel.chat_tokens(100, 20, 0)
    tel.latency("retrieve", 0.012)
    counted = clients.query_cache_counters(tel.batch)
    counted(True)
    counted(False)
    counted(True)
    assert all(c.calls == [] for c in fake.counters.values())  # nothing reaches Ray per request
    assert fake.observed["ragserve_stage_latency_ms"] == [12.0]  # histograms are observed at once
    tel.batch.close()
    requests = {(("mode", "rag"), ("reason", ""), ("route", "/retrieve"), ("status", "200")): 3}
    assert fake.counters["ragserve_requests"].totals() == requests
    tokens = {(("index", "kb"), ("key", "team-a"), ("kind", "prompt")): 150}
    assert fake.counters["ragserve_usage_tokens"].totals() == tokens
    assert fake.counters["ragserve_answer_cache_hits"].calls == [(1, {})]
    assert fake.counters["ragserve_history_messages_dropped"].calls == []
    hits = [c for name, c in fake.counters.items() if "query" in name and "hit" in name]
    misses = [c for name, c in fake.counters.items() if "query" in name and "miss" in name]
    assert [c.calls for c in hits] == [[(2, {})]] and [c.calls for c in misses] == [[(1, {})]]


def test_a_count_after_close_is_handed_over_at_once_and_close_inside_a_flush_does_not_wait_for_itself() -> None:
    """A request finishing during shutdown counts after ``close``: no thread flushes any more, so the
    count goes to its counter at once. And a ``__del__`` the garbage collector runs inside ``flush``
    (on the thread holding the batch's lock) may close the batch there: the lock is re-entrant."""
    counter = RecordingCounter()
    batch = CounterBatch(flush_s=60)
    batch.close()
    batch.inc(counter, 2, {"route": "/late"})
    assert counter.totals() == {(("route", "/late"),): 2}

    class ClosesInside(RecordingCounter):
        def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
            inner.close()  # as a finaliser run here would
            super().inc(value, tags)

    inner = CounterBatch(flush_s=60)
    closing = ClosesInside()
    inner.inc(closing, 1)
    done = threading.Event()

    def flush() -> None:
        with inner._lock:  # the flush of a collector run inside a locked section
            inner.flush()
        done.set()

    threading.Thread(target=flush, daemon=True).start()
    assert done.wait(5), "close inside flush deadlocked"
    assert closing.totals() == {(): 1}

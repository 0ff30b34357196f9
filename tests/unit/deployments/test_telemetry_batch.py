"""Counter increments summed by ``CounterBatch`` reach their counters whole: by counter and tag
set, from its own thread within a flush period, and on ``flush``/``close``."""

from __future__ import annotations

import gc
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

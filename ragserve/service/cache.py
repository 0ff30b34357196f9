"""A least-recently-used cache whose entries expire: the query-embedding cache.

Queries repeat (the same question from many users, retries, the load balancer's health probes),
and embedding one costs a model call; a hit costs a dict lookup. Entries expire after a TTL
(24 h by default, as in the reference RAG bot) so that a model swap is eventually seen.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class TTLCache(Generic[V]):
    """Thread-safe LRU with a time-to-live; counts hits and misses."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        if max_entries < 0 or ttl_s <= 0:
            raise ValueError("max_entries must be >= 0 and ttl_s > 0")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._data: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            item = self._data.get(key)
            if item is None or item[0] <= self._clock():
                if item is not None:
                    del self._data[key]
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return item[1]

    def put(self, key: Hashable, value: V) -> None:
        if self.max_entries == 0:
            return
        with self._lock:
            self._data[key] = (self._clock() + self.ttl_s, value)
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    async def get_or_compute(self, key: Hashable, compute: Callable[[], Awaitable[V]]) -> tuple[V, bool]:
        """``(value, hit)``: the cached value, or ``compute()``'s, which is then cached."""
        value = self.get(key)
        if value is not None:
            return value, True
        value = await compute()
        self.put(key, value)
        return value, False

    def __len__(self) -> int:
        return len(self._data)


def normalise_query(text: str) -> str:
    """The cache key's text: case and runs of whitespace do not change what a query means."""
    return " ".join(text.lower().split())

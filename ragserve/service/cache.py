"""A least-recently-used cache whose entries expire: the query-embedding cache, and the vectors of
evidence passages (``PassageVectors``).

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

import numpy as np

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

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


def normalise_query(text: str) -> str:
    """The cache key's text: case and runs of whitespace do not change what a query means."""
    return " ".join(text.lower().split())


class PassageVectors:
    """Vectors of short passages (an answer's evidence windows), cached by their exact text.

    A RAG chat embeds a dozen or more sentences of its sources to find its evidence
    (``ragserve.rag.evidence``): about twenty times the tokens of its query, and under load the
    largest CPU cost of a chat (docs/benchmarks.md, issue 28). The same documents answer many
    questions, so the same windows come back: a hit costs a dict lookup. Only the misses are
    embedded, in one call of ``embed`` (the embedder's document path). The text is the key as it is
    (no case folding: the vector of a passage, unlike a query's cache key, must be that text's).
    Bounded by ``max_entries`` (``passage_cache_size``; 0 turns it off), least recently used first out.
    """

    def __init__(
        self,
        embed: Callable[[list[str]], Awaitable[np.ndarray]],
        max_entries: int,
        ttl_s: float = 24 * 3600.0,
    ):
        self._embed = embed
        self._cache: TTLCache[np.ndarray] = TTLCache(max_entries, ttl_s)

    @property
    def hits(self) -> int:
        return self._cache.hits

    @property
    def misses(self) -> int:
        return self._cache.misses

    def __len__(self) -> int:
        return len(self._cache)

    async def embed(self, texts: list[str]) -> np.ndarray:
        """One vector per text, in order; a text repeated in ``texts`` is embedded once."""
        found: dict[str, np.ndarray] = {}
        missing: list[str] = []
        for t in texts:
            if t in found or t in missing:
                continue
            vec = self._cache.get(t)
            if vec is None:
                missing.append(t)
            else:
                found[t] = vec
        if missing:
            vecs = await self._embed(missing)
            for t, v in zip(missing, vecs, strict=True):
                v = np.array(v, dtype=np.float32)  # a row of its own, not a view pinning the batch
                found[t] = v
                self._cache.put(t, v)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([found[t] for t in texts])

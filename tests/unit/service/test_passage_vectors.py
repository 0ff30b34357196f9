"""``PassageVectors``: only the texts not seen are embedded, in one call, in order; the bound holds."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ragserve.service.cache import PassageVectors


class CountingEmbedder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.array([[float(len(t)), float(ord(t[0]))] for t in texts], dtype=np.float32)


def test_only_unseen_texts_are_embedded_once_each_in_one_call_and_in_order() -> None:
    e = CountingEmbedder()
    cache = PassageVectors(e.embed, max_entries=10)
    first = asyncio.run(cache.embed(["alpha", "bb", "alpha"]))
    assert e.calls == [["alpha", "bb"]]
    assert first.tolist() == [[5.0, 97.0], [2.0, 98.0], [5.0, 97.0]]
    second = asyncio.run(cache.embed(["bb", "cccc", "alpha"]))
    assert e.calls[-1] == ["cccc"] and len(e.calls) == 2
    assert second.tolist() == [[2.0, 98.0], [4.0, 99.0], [5.0, 97.0]]
    assert asyncio.run(cache.embed([])).shape[0] == 0 and len(e.calls) == 2


def test_a_cached_vector_is_a_copy_the_caller_cannot_change() -> None:
    e = CountingEmbedder()
    cache = PassageVectors(e.embed, max_entries=10)
    out = asyncio.run(cache.embed(["alpha"]))
    out[0, 0] = -1.0  # the caller's array, not the cache's row
    assert asyncio.run(cache.embed(["alpha"])).tolist() == [[5.0, 97.0]]


def test_the_bound_drops_the_least_recently_used_and_zero_keeps_nothing() -> None:
    e = CountingEmbedder()
    cache = PassageVectors(e.embed, max_entries=2)
    asyncio.run(cache.embed(["a", "b"]))
    asyncio.run(cache.embed(["a"]))  # a is now the most recent
    asyncio.run(cache.embed(["c"]))  # b goes
    assert len(cache) == 2
    asyncio.run(cache.embed(["a", "b"]))
    assert e.calls[-1] == ["b"]
    off = PassageVectors(e.embed, max_entries=0)
    asyncio.run(off.embed(["a"]))
    asyncio.run(off.embed(["a"]))
    assert len(off) == 0 and e.calls[-2:] == [["a"], ["a"]]


def test_an_embedder_failure_reaches_the_caller_and_caches_nothing() -> None:
    async def broken(texts: list[str]) -> np.ndarray:
        raise RuntimeError("embedder down")

    cache = PassageVectors(broken, max_entries=4)
    with pytest.raises(RuntimeError, match="embedder down"):
        asyncio.run(cache.embed(["a"]))
    assert len(cache) == 0

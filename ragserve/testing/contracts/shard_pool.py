"""The contract of ``ragserve.ports.ShardPool``, run by the in-process pool (unit tests) and by the
pool of Ray shard actors (integration tests): the document service relies on exactly this, so
whatever holds for one pool must hold for the other.

A test module subclasses :class:`ShardPoolContract` and provides a ``pool`` fixture: two fresh,
empty shards.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ragserve.ports import ShardPool
from ragserve.service.shard_service import ShardService
from ragserve.store import (
    ChunkWrite,
    DimensionMismatchError,
    DocumentWrite,
    SearchCandidates,
    SearchHit,
    StoredDocument,
)


def write(doc_id: str, text: str, dim: int = 4, seed: int = 0) -> DocumentWrite:
    vec = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    vec /= np.linalg.norm(vec)
    return DocumentWrite(
        doc_id=doc_id,
        text=text,
        metadata={"n": seed},
        hash_value=f"h-{doc_id}",
        chunks=[ChunkWrite(node_id=f"{doc_id}-0", chunk_index=0, text=text, vector=vec)],
    )


class ShardPoolContract:
    async def test_only_shard_service_methods_are_called(self, pool: ShardPool[ShardService]) -> None:
        """Both pools accept the same methods: ``ShardService``'s own public ones, never a look-alike
        name (another class's ``ping``, a free function) or a private or special method."""

        class Other:
            def ping(self) -> str:
                return "other"

        def ping(shard: ShardService) -> str:
            return "free"

        for wrong in (Other.ping, ping, ShardService.__init__):
            with pytest.raises(TypeError, match="not a ShardService method"):
                await pool.call(0, wrong)  # type: ignore[arg-type]
        assert await pool.call_all(ShardService.ping) == [0, 1]

    async def test_every_shard_answers_in_shard_order(self, pool: ShardPool[ShardService]) -> None:
        assert pool.num_shards == 2
        await pool.call(1, ShardService.upsert_documents, index="kb", docs=[write("d1", "only on shard one")])
        assert await pool.call_all(ShardService.count_documents, "kb") == [0, 1]
        assert await pool.call_all(ShardService.list_indexes) == [[], ["kb"]]

    async def test_values_cross_the_pool_intact(self, pool: ShardPool[ShardService]) -> None:
        doc = write("d1", "a document about valves", seed=3)
        assert await pool.call(0, ShardService.upsert_documents, index="kb", docs=[doc]) == ["d1"]
        stored = (await pool.call(0, ShardService.get_documents, index="kb", doc_ids=["d1"]))["d1"]
        assert isinstance(stored, StoredDocument)
        assert (stored.text, stored.metadata, stored.hash_value) == (doc.text, {"n": 3}, "h-d1")
        hits = await pool.call(0, ShardService.search, index="kb", vector=doc.chunks[0].vector, k=1)
        assert hits is not None and isinstance(hits[0], SearchHit) and hits[0].doc_id == "d1"
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        no_index = await pool.call(1, ShardService.search, index="kb", vector=doc.chunks[0].vector, k=1)
        assert no_index is None  # no such index there

    async def test_search_candidates_cross_the_pool_in_one_call(self, pool: ShardPool[ShardService]) -> None:
        doc = write("d1", "the XR-7720 bracket", seed=3)
        await pool.call(0, ShardService.upsert_documents, index="kb", docs=[doc])
        await pool.call(0, ShardService.upsert_documents, index="kb2", docs=[doc])
        found, other, absent = await pool.call(
            0,
            ShardService.search_indexes,
            indexes=["kb", "kb2", "nowhere"],
            vector=doc.chunks[0].vector,
            text="XR-7720",
            k=5,
            mode="hybrid",
            metadata_filter=None,
            min_match=0.5,
            max_postings=2000,
        )
        assert isinstance(found, SearchCandidates) and isinstance(other, SearchCandidates) and absent is None
        assert [h.doc_id for h in found.dense] == ["d1"] and [h.doc_id for h in found.lexical] == ["d1"]
        assert [h.index for h in found.dense + found.lexical] == ["kb", "kb"]
        assert [h.index for h in other.dense + other.lexical] == ["kb2", "kb2"]  # each hit names its index
        lexical_score = found.lexical[0].lexical_score
        assert found.lexical[0].all_terms and lexical_score is not None and lexical_score > 0
        assert found.lexical[0].lexical_coverage == pytest.approx(1.0)
        assert found.lexical[0].score == pytest.approx(1.0, abs=1e-5)
        missing = await pool.call(
            1, ShardService.search_indexes, indexes=["kb"], vector=doc.chunks[0].vector, text="XR-7720", k=5
        )
        assert missing == [None]
        held = await pool.call_all(ShardService.mentioned, indexes=["nowhere", "kb2"], words=["bracket", "gasket"])
        assert held == [["bracket"], []]

    async def test_a_shard_error_reaches_the_caller_as_itself(self, pool: ShardPool[ShardService]) -> None:
        await pool.call(0, ShardService.upsert_documents, index="kb", docs=[write("d1", "four dimensions")])
        with pytest.raises(DimensionMismatchError, match="4-d vectors, got 3-d"):
            await pool.call(0, ShardService.upsert_documents, index="kb", docs=[write("d2", "three dimensions", dim=3)])
        assert await pool.call_all(ShardService.count_documents, "kb") == [1, 0]  # the failed write left nothing

    async def test_concurrent_reads_each_get_their_own_answer(self, pool: ShardPool[ShardService]) -> None:
        """Many reads at once (which a pool may send together, ``ReadBatcher``): each caller gets
        the answer to its own read, one read's error reaches its caller alone, as itself, and a
        write that returned is seen by every read made after it."""
        docs = [write(f"d{i}", f"note number {i}", seed=i) for i in range(12)]
        await pool.call(0, ShardService.upsert_documents, index="kb", docs=docs[:6])
        await pool.call(1, ShardService.upsert_documents, index="kb", docs=docs[6:])
        searches = [
            pool.call(i % 2, ShardService.search, index="kb", vector=docs[i].chunks[0].vector, k=1) for i in range(12)
        ]
        counts = [pool.call(s, ShardService.count_documents, "kb") for s in (0, 1) * 4]
        wrong = pool.call(0, ShardService.search, index="kb", vector=np.ones(3, dtype=np.float32), k=1)
        got = await asyncio.gather(*searches, wrong, *counts, return_exceptions=True)
        found, error, counted = got[:12], got[12], got[13:]
        for i, hits in enumerate(found):
            on_its_shard = (i < 6) == (i % 2 == 0)
            if on_its_shard:
                assert isinstance(hits, list) and hits[0].doc_id == f"d{i}"
            else:
                assert isinstance(hits, list) and hits and hits[0].doc_id != f"d{i}"
        assert isinstance(error, DimensionMismatchError)
        assert counted == [6, 6] * 4
        await pool.call(1, ShardService.delete_documents, index="kb", doc_ids=["d6", "d7"])
        after = await asyncio.gather(*(pool.call(1, ShardService.count_documents, "kb") for _ in range(8)))
        assert after == [4] * 8

"""Index statistics from the shards up: counts agree with what was written and deleted, bytes are
UTF-8 bytes of the text, and the service sums the shards and says when no shard has the index."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ragserve.api.stats import IndexStats
from ragserve.errors import NotFoundError
from ragserve.service.documents import DocumentService
from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout
from ragserve.store import ChunkWrite, DocumentWrite


def write(doc_id: str, text: str, chunks: int, dim: int = 8) -> DocumentWrite:
    rng = np.random.default_rng(abs(hash(doc_id)) % 2**32)
    return DocumentWrite(
        doc_id=doc_id,
        text=text,
        metadata={},
        hash_value=f"h-{doc_id}",
        chunks=[
            ChunkWrite(f"{doc_id}-{k}", k, f"chunk {k}", rng.standard_normal(dim).astype(np.float32))
            for k in range(chunks)
        ],
    )


def test_shard_counts_follow_writes_and_deletes(tmp_path: Path) -> None:
    shard = ShardService(tmp_path, 0, 1, faiss_kind="hnsw")
    try:
        assert shard.index_stats("kb") is None
        shard.upsert_documents("kb", [write("a", "héllo", 3), write("b", "world", 2)])
        assert shard.index_stats("kb") == {
            "shard": 0,
            "documents": 2,
            "chunks": 5,
            "bytes": 11,
            "vectors": 5,
            "dimension": 8,
            "index_kind": "hnsw",
        }
        shard.upsert_documents("kb", [write("a", "hi", 1)])  # replaced: its chunks too
        shard.delete_documents("kb", ["b"])
        s = shard.index_stats("kb")
        assert (s["documents"], s["chunks"], s["bytes"]) == (1, 1, 2)
        assert s["vectors"] >= 1  # hnsw masks deleted vectors until its next rebuild
    finally:
        shard.close()


async def test_service_sums_the_shards(tmp_path: Path) -> None:
    check_layout(tmp_path, 3)
    pool = LocalShardPool([ShardService(tmp_path, i, 3) for i in range(3)])
    docs = DocumentService(pool, embedder=None, chunker=None, storage_dir=tmp_path)  # type: ignore[arg-type]
    try:
        await pool.call(0, ShardService.upsert_documents, index="kb", docs=[write("a", "one", 2)])
        await pool.call(2, ShardService.upsert_documents, index="kb", docs=[write("b", "three", 1), write("c", "x", 4)])
        s = await docs.stats("kb")
        assert isinstance(s, IndexStats)
        assert (s.documents, s.chunks, s.bytes, s.vectors, s.dimension) == (3, 7, 9, 7, 8)
        assert s.vector_bytes == 7 * 8 * 4 and s.index_kind == "flat"
        assert [(sh.shard, sh.documents) for sh in s.shards] == [(0, 1), (2, 2)]  # shard 1 has no part of it
        with pytest.raises(NotFoundError, match=r"No such index: 'nope' exists\."):
            await docs.stats("nope")
    finally:
        pool.close()


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_stats_during_a_write_never_count_rows_without_their_vectors(tmp_path: Path, monkeypatch, kind: str) -> None:
    """A stats read while a write has committed its rows but not yet added their vectors to FAISS
    saw vectors != chunks; it now waits for the write and counts both after it."""
    shard = ShardService(tmp_path, 0, 1, faiss_kind=kind)
    store = shard._shard
    try:
        shard.upsert_documents("kb", [write("a", "first", 2)])
        real = store._mirror.apply
        committed = threading.Event()

        def slow_apply(*args, **kwargs):  # type: ignore[no-untyped-def]
            committed.set()  # the rows are committed; FAISS does not have them yet
            time.sleep(0.3)
            return real(*args, **kwargs)

        monkeypatch.setattr(store._mirror, "apply", slow_apply)
        writer = threading.Thread(target=shard.upsert_documents, args=("kb", [write("b", "second", 5)]))
        writer.start()
        assert committed.wait(10)
        during = shard.index_stats("kb")
        writer.join(10)
        assert (during["documents"], during["chunks"], during["vectors"]) == (2, 7, 7), during
    finally:
        shard.close()


def test_shard_metrics_skip_an_index_dropped_while_they_are_counted(tmp_path: Path, monkeypatch) -> None:
    shard = ShardService(tmp_path, 0, 1)
    try:
        shard.upsert_documents("kb", [write("a", "first", 2)])
        shard.upsert_documents("gone", [write("b", "second", 1)])
        listed = shard.list_indexes()
        monkeypatch.setattr(shard, "list_indexes", lambda: listed)
        shard._shard.drop_index("gone")  # after the list was taken
        assert shard.stats()["indexes"] == {"kb": {"documents": 1, "chunks": 2}}
    finally:
        shard.close()

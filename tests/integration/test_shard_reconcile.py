"""Shard actors outlive a deployment; a redeploy under another FAISS index kind replaces them (the
setting takes effect) and every document is still there and searchable; the same settings keep them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ragserve.api.documents import Document
from ragserve.config import Settings
from ragserve.ingest import DocumentChunker, hf_token_counter
from ragserve.service.documents import DocumentService
from ragserve.testing.contracts.shard_pool import ShardPoolContract

pytestmark = pytest.mark.slow


def test_redeploy_with_another_index_kind_replaces_the_shards(ray_cluster, tmp_path: Path, embedder) -> None:
    import ray

    from ragserve.deployments.vector_index import RayShardPool, get_or_create_shards, reconcile_shards

    flat = Settings(storage_dir=str(tmp_path), num_shards=2, shard_num_cpus=0.1)
    hnsw = flat.model_copy(update={"faiss_index_kind": "hnsw"})
    chunker = DocumentChunker(hf_token_counter(embedder.model.tokenizer), 128, 16)
    docs = [
        Document(text=f"Maintenance note {i}: valve {i} on line {i % 5} was replaced.", doc_id=f"n{i}")
        for i in range(40)
    ]

    async def scenario() -> None:
        first = await reconcile_shards(flat, get_or_create_shards(flat))
        service = DocumentService(RayShardPool(first), embedder, chunker, storage_dir=tmp_path)
        await service.add_documents("notes", docs)
        assert [o["faiss_kind"] for o in await asyncio.gather(*(a.open_options.remote() for a in first))] == [
            "flat",
            "flat",
        ]

        again = await reconcile_shards(flat, get_or_create_shards(flat))
        assert [a._actor_id for a in again] == [a._actor_id for a in first]  # same settings: kept

        second = await reconcile_shards(hnsw, get_or_create_shards(hnsw))
        assert all(a._actor_id != b._actor_id for a, b in zip(first, second, strict=True))
        opened = await asyncio.gather(*(a.open_options.remote() for a in second))
        assert [o["faiss_kind"] for o in opened] == ["hnsw", "hnsw"]
        stats = await asyncio.gather(*(a.stats.remote() for a in second))
        assert sum(st["indexes"]["notes"]["documents"] for st in stats) == 40  # reopened from the same files

        service = DocumentService(RayShardPool(second), embedder, chunker, storage_dir=tmp_path)
        assert await service.count_documents("notes") == 40
        for i in (0, 17, 39):
            nodes, _ = await service.retrieve("notes", docs[i].text, 1)
            assert nodes[0].doc_id == f"n{i}"

    asyncio.run(scenario())
    for a in get_or_create_shards(hnsw):
        ray.kill(a, no_restart=True)


class TestRayShardPool(ShardPoolContract):
    """The shard-pool contract on shard actors, through Ray handles (errors cross as themselves)."""

    @pytest.fixture
    async def pool(self, ray_cluster, tmp_path: Path):
        import ray

        from ragserve.deployments.vector_index import RayShardPool, get_or_create_shards, reconcile_shards

        settings = Settings(storage_dir=str(tmp_path), num_shards=2, shard_num_cpus=0.1)
        actors = await reconcile_shards(settings, get_or_create_shards(settings))
        pool = RayShardPool(actors)
        await pool.wait_ready()
        yield pool
        for actor in actors:
            ray.kill(actor)


class TestRayShardPoolBatched(ShardPoolContract):
    """The same contract with reads held and sent together (``ReadBatcher``) as soon as one call to
    a shard is out: concurrent reads cross in ``read_many`` calls, writes alone."""

    @pytest.fixture
    async def pool(self, ray_cluster, tmp_path: Path):
        import ray

        from ragserve.deployments.vector_index import RayShardPool, get_or_create_shards, reconcile_shards

        settings = Settings(storage_dir=str(tmp_path), num_shards=2, shard_num_cpus=0.1)
        actors = await reconcile_shards(settings, get_or_create_shards(settings))
        pool = RayShardPool(actors, reads_in_flight=1)
        await pool.wait_ready()
        yield pool
        for actor in actors:
            ray.kill(actor)

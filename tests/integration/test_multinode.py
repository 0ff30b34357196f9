"""Shards on a three-node Ray cluster (ray.cluster_utils): placed on different nodes; a node is
removed; its shard restarts on another node, reopens its files, and every acknowledged document
is searchable again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ragserve.api.documents import Document
from ragserve.config import Settings
from ragserve.ingest import DocumentChunker, hf_token_counter
from ragserve.service.documents import DocumentService

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    from ragserve.deployments.platform import apply_serve_env

    apply_serve_env()  # the nodes' raylets inherit the mode, as the pods of kuberay/ do
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # no work on the head, as in kuberay/
    workers = [c.add_node(num_cpus=1) for _ in range(3)]
    ray.init(address=c.address)
    c.wait_for_nodes()
    yield c, workers
    ray.shutdown()
    c.shutdown()


def test_shards_spread_and_survive_node_loss(cluster, tmp_path: Path, embedder) -> None:
    import ray

    from ragserve.deployments.vector_index import RayShardPool, get_or_create_shards

    c, workers = cluster
    settings = Settings(storage_dir=str(tmp_path), num_shards=3, shard_num_cpus=0.5)
    actors = get_or_create_shards(settings)
    placed = ray.get([a.node_id.remote() for a in actors], timeout=120)
    assert len(set(placed)) == 3, f"shards share nodes: {placed}"

    pool = RayShardPool(actors)
    chunker = DocumentChunker(hf_token_counter(embedder.model.tokenizer), 128, 16)
    service = DocumentService(pool, embedder, chunker, storage_dir=tmp_path)
    docs = [
        Document(text=f"Incident report {i}: pump {i} lost pressure at station {i % 7}.", doc_id=f"r{i}")
        for i in range(60)
    ]

    async def ingest() -> None:
        await service.add_documents("incidents", docs)

    asyncio.run(ingest())
    counts = ray.get([a.count_documents.remote("incidents") for a in actors])
    assert sum(counts) == 60 and all(counts)

    victim_node = placed[0]
    node = next(w for w in workers if w.node_id == victim_node)
    c.remove_node(node)

    deadline = time.monotonic() + 180
    moved = None
    while time.monotonic() < deadline:
        try:
            moved = ray.get(actors[0].node_id.remote(), timeout=10)
            if moved != victim_node:
                break
        except Exception:  # restarting
            pass
        time.sleep(1)
    assert moved is not None and moved != victim_node and moved in {w.node_id for w in workers}

    async def check() -> tuple[int, list[str]]:
        total = await service.count_documents("incidents")
        found = []
        for i in (0, 13, 29, 44, 59):
            nodes, _ = await service.retrieve("incidents", docs[i].text, 1)
            found.append(nodes[0].doc_id)
        return total, found

    total, found = asyncio.run(check())
    assert total == 60
    assert found == ["r0", "r13", "r29", "r44", "r59"]

"""The Embedder deployment's query path, run as a plain class (no Ray Serve): a query alone is
encoded at once, concurrent queries share model calls, and repeats come from the cache."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

import ragserve.deployments.embedder as embedder_mod
from ragserve.config import Settings


class CountingModel:
    """Stands in for sentence-transformers: records every model call and takes a few ms."""

    model_id = "counting"
    dim = 4
    tokenizer = None
    device = "cpu"
    num_parameters = 4
    max_seq_length = 256

    def __init__(self, *args: object, **kwargs: object):
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        with self._lock:
            self.calls.append(list(texts))
        time.sleep(0.02)
        return np.array([[float(len(t)), 1.0, 0.0, 0.0] for t in texts], dtype=np.float32)


@pytest.fixture
def embedder(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(embedder_mod, "LocalEmbeddingModel", CountingModel)
    # @serve.batch reads the replica's max_ongoing_requests when its queue starts; outside a
    # replica, give it what the deployment declares
    from ray import serve

    replica = SimpleNamespace(_deployment_config=SimpleNamespace(max_ongoing_requests=128))
    monkeypatch.setattr(serve, "get_replica_context", lambda: replica)
    cls = embedder_mod.Embedder.func_or_class
    wait_s = getattr(request, "param", 0.05)  # the batch queue's timeout (indirect parameter)
    yield cls(Settings(embedding_batch_wait_s=wait_s, embedding_batch_size=32))
    # @serve.batch keeps its queue on the class, made at the first batched call: left there, it
    # holds weakrefs, and a deployment of the class later in this process (pickled by value: the
    # module's name is the Deployment) fails "cannot pickle 'weakref.ReferenceType' object"
    cls._embed_query_batch.set_max_batch_size.__self__._queue = None


@pytest.mark.parametrize("embedder", [3.0], indirect=True)  # a batch timeout no busy host can hide
async def test_a_query_alone_does_not_wait_for_the_batch_timeout(embedder) -> None:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    vec = await embedder.embed_query("how do shards restart?")
    took = time.perf_counter() - t0
    assert vec.shape == (4,)
    assert embedder.model.calls == [["how do shards restart?"]]
    assert took < 1.5, f"a lone query waited {took * 1000:.0f} ms: it went through the batch queue"


async def test_concurrent_queries_share_model_calls(embedder) -> None:  # type: ignore[no-untyped-def]
    texts = [f"question number {i}" for i in range(12)]
    vecs = await asyncio.gather(*(embedder.embed_query(t) for t in texts))
    assert [v[0] for v in vecs] == [float(len(t)) for t in texts]  # each caller got its own vector
    encoded = [t for call in embedder.model.calls for t in call]
    assert sorted(encoded) == sorted(texts)
    assert len(embedder.model.calls) <= 3, embedder.model.calls  # the first alone, the rest batched


async def test_repeated_query_is_served_from_the_cache(embedder) -> None:  # type: ignore[no-untyped-def]
    await embedder.embed_query("What is  RAG?")
    await embedder.embed_query("what is rag?")
    assert len(embedder.model.calls) == 1
    assert embedder.info()["cache_hits"] == 1
    # what the ingress decides query embedding from (ragserve.service.query_embedding)
    assert {k: embedder.info()[k] for k in ("remote", "device", "params")} == {
        "remote": False,
        "device": "cpu",
        "params": 4,
    }


async def test_a_query_goes_before_an_ingestions_waiting_batches(embedder) -> None:  # type: ignore[no-untyped-def]
    """An ingestion's batches are ``bulk``: a query arriving behind ten of them is encoded after the
    one on the worker, not after all ten; the documents still come back whole and in order."""
    texts = [f"chunk {i:03d} " + "x" * (i % 5) for i in range(320)]  # ten parts of 32, one worker
    ingest = asyncio.ensure_future(embedder.embed_documents(texts, bulk=True))
    while not embedder.model.calls:
        await asyncio.sleep(0.001)
    vec = await embedder.embed_query("a question in the middle of an ingestion")
    assert vec.shape == (4,)
    order = [c[0] for c in embedder.model.calls]
    assert order.index("a question in the middle of an ingestion") == 1, order
    vectors = await ingest
    assert vectors.shape == (320, 4) and [v[0] for v in vectors] == [float(len(t)) for t in texts]
    assert len(embedder.model.calls) == 11


class _OldEmbedderHandle:
    """An Embedder replica from before ``bulk`` behind its handle: the keyword is a TypeError there,
    as Ray raises the replica's exception (a subclass of its cause) at the caller."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.embed_documents = self

    async def remote(self, texts: list[str], **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append(dict(kwargs))
        if "bulk" in kwargs:
            raise TypeError("Embedder.embed_documents() got an unexpected keyword argument 'bulk'")
        return np.zeros((len(texts), 4), dtype=np.float32)


async def test_an_older_embedder_without_bulk_still_embeds_an_ingestion() -> None:
    """During a rolling update a new ingress meets an old Embedder: its ingestion is embedded (first
    in line, as before) instead of failing every POST /index until the rollout ends; interactive
    calls never send the keyword."""
    from ragserve.deployments.clients import HandleEmbedder

    handle = _OldEmbedderHandle()
    client = HandleEmbedder(handle)
    assert (await client.embed_documents(["a", "b"], bulk=True)).shape == (2, 4)
    assert (await client.embed_documents(["c"], bulk=True)).shape == (1, 4)
    assert (await client.embed_documents(["d"])).shape == (1, 4)
    assert ["bulk" in c for c in handle.calls] == [True, False, False, False]  # asked once, then remembered

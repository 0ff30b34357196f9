"""Embedder deployment: sentence-transformers (or a remote /v1/embeddings), batched and cached.

Queries from concurrent requests are gathered by ``@serve.batch`` into one model call; a query
that arrives alone skips the batch queue (waiting for company that is not coming would only add
the batch wait to its latency). Documents arrive already in batches; ``EncodeWorkers`` encodes
them on a worker thread per core, a batch each (``embedding_workers``), an ingestion's (``bulk``)
after any query or passage waiting. Query vectors are cached (LRU + TTL) by model and normalised text.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from ray import serve
from ray.serve import metrics

from ragserve import heap, tracing
from ragserve.config import Settings, secret
from ragserve.deployments.common import as_settings, log
from ragserve.deployments.telemetry import CounterBatch
from ragserve.hardware import release_free_memory
from ragserve.models.embeddings import LocalEmbeddingModel, RemoteEmbeddingModel, document_workers
from ragserve.models.tokenizers import ApproxTokenCounter
from ragserve.service.cache import TTLCache, normalise_query


@serve.deployment(name="Embedder", max_ongoing_requests=128, ray_actor_options={"num_cpus": 1})
class Embedder:
    def __init__(self, settings: Settings | dict[str, Any] | None = None):
        tracing.configure("embedder")  # on when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set
        s = as_settings(settings)
        if s.embedding_url:
            self.model: LocalEmbeddingModel | RemoteEmbeddingModel = RemoteEmbeddingModel(
                s.embedding_url, s.embedding_model, secret(s.embedding_api_key)
            )
        else:
            device = None if s.embedding_device == "auto" else s.embedding_device
            self.model = LocalEmbeddingModel(s.embedding_model, device=device, threads=s.embedding_threads)
        self.batch_size = s.embedding_batch_size
        batcher: Any = self._embed_query_batch  # @serve.batch added the setters
        batcher.set_max_batch_size(s.embedding_batch_size)
        batcher.set_batch_wait_timeout_s(s.embedding_batch_wait_s)
        self._workers = document_workers(self.model, s.embedding_workers, s.embedding_threads)
        self._queries_in_flight = 0
        self._approx = ApproxTokenCounter("the remote embedding model's tokenizer is not available here")
        self.cache: TTLCache[np.ndarray] = TTLCache(s.embedding_cache_size, s.embedding_cache_ttl_s)
        self._counts = CounterBatch()
        self._hits = metrics.Counter("ragserve_embedding_cache_hits", "Query-embedding cache hits.")
        self._misses = metrics.Counter("ragserve_embedding_cache_misses", "Query-embedding cache misses.")
        self._latency = metrics.Histogram(
            "ragserve_embedding_latency_ms",
            "Model time per embedding call.",
            boundaries=[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000],
            tag_keys=("kind",),
        )
        log.info(
            "embedder ready: model=%s dim=%d workers=%d", self.model.model_id, self.model.dim, self._workers.workers
        )
        heap.settle("embedder")

    async def _encode(self, texts: list[str], kind: str, bulk: bool = False) -> np.ndarray:
        t0 = time.perf_counter()
        vecs = await self._workers.encode(texts, self.batch_size, bulk=bulk)
        self._latency.observe((time.perf_counter() - t0) * 1000, tags={"kind": kind})
        return vecs

    @serve.batch  # its size and wait are the settings', set in __init__
    async def _embed_query_batch(self, texts: list[str]) -> list[np.ndarray]:
        return list(await self._encode(texts, "query"))

    # ``trace``: the caller's W3C context (``HandleEmbedder``): the call is a span of this replica
    # (docs/architecture.md §7).
    async def embed_query(self, text: str, trace: Mapping[str, str] | None = None) -> np.ndarray:
        key = (self.model.model_id, normalise_query(text))
        with tracing.remote_span("embedder.embed_query", trace) as span:
            vec, hit = await self.cache.get_or_compute(key, lambda: self._encode_query(text))
            if tracing.ENABLED:
                span.set_attribute("ragserve.cache_hit", hit)
        self._counts.inc(self._hits if hit else self._misses)
        return vec

    async def _encode_query(self, text: str) -> np.ndarray:
        alone = self._queries_in_flight == 0
        self._queries_in_flight += 1
        try:
            if alone:  # nothing to batch with: encode now rather than wait out the batch timeout
                return (await self._encode([text], "query"))[0]
            return await self._embed_query_batch(text)
        finally:
            self._queries_in_flight -= 1

    async def embed_documents(
        self, texts: list[str], trace: Mapping[str, str] | None = None, bulk: bool = False
    ) -> np.ndarray:
        """``bulk`` (an ingestion's batches): its parts wait while queries and passages go first."""
        attributes = {"ragserve.texts": len(texts)} if tracing.ENABLED else None
        with tracing.remote_span("embedder.embed_documents", trace, attributes):
            vecs = await self._encode(texts, "documents", bulk)
        # a batch of long documents leaves its activations' pages in the C heap: give them back
        await self._workers.run(release_free_memory, bulk=bulk)
        return vecs

    async def count_tokens(self, texts: list[str], over: int | None = None, total_over: int | None = None) -> list[int]:
        if isinstance(self.model, LocalEmbeddingModel):  # off the replica's event loop: 1 MB is seconds
            counts: list[int] = await self._workers.run(self.model.count_tokens, texts, over, total_over)
            return counts
        return [self._approx.count_text(t) for t in texts]

    def info(self) -> dict[str, Any]:
        """What the model is, and where it runs: the ingress decides from it whether to embed
        queries itself (``ragserve.service.query_embedding.choose_query_embedding``)."""
        where: dict[str, Any] = {"remote": True, "device": "remote", "params": None, "max_input_tokens": None}
        if isinstance(self.model, LocalEmbeddingModel):
            where = {
                "remote": False,
                "device": self.model.device,
                "params": self.model.num_parameters,
                "max_input_tokens": self.model.max_seq_length,  # what it reads of a text; the rest is cut
            }
        return {
            "model_id": self.model.model_id,
            "dim": self.model.dim,
            **where,
            "cache_entries": len(self.cache),
            "cache_hits": self.cache.hits,
            "cache_misses": self.cache.misses,
        }

    def __del__(self) -> None:
        """At the replica's shutdown: the counts of its last second are recorded in Ray's metrics."""
        counts = getattr(self, "_counts", None)
        if counts is not None:
            counts.close()

    def tokenizer(self) -> Any:
        """The embedding model's tokenizer, for sizing chunks in the ingress (pickled once)."""
        return self.model.tokenizer

"""Query embedding in the process that serves the request (``query_embedding: ingress``).

A query is one short text; with a small encoder (all-MiniLM-L6-v2: 22M parameters, ~6 ms a
query on two CPU cores) the call to an Embedder replica and back costs more than the encoding
itself. ``InProcessQueryEmbedder`` therefore encodes queries with a model loaded in this process,
and leaves documents (ingestion: large batches, where one shared model replica keeps the cores
busy) and token counts to another embedder, the Embedder deployment behind a handle.

:func:`choose_query_embedding` decides where queries are embedded; the ingress asks the Embedder
deployment what it runs (``Embedder.info``) and applies it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np

from ragserve.config import QueryEmbeddingSetting
from ragserve.models.embeddings import LocalEmbeddingModel
from ragserve.ports import TextEmbedder
from ragserve.service.cache import TTLCache, normalise_query

#: Largest encoder ``auto`` loads into each ingress replica: every replica holds a copy, and a query
#: on a larger model takes long enough on a CPU that the hop to a shared (GPU) replica is the lesser cost.
MAX_INGRESS_EMBEDDING_PARAMS = 200_000_000


def choose_query_embedding(
    setting: QueryEmbeddingSetting, *, remote: bool, device: str, params: int | None
) -> Literal["ingress", "deployment"]:
    """Where queries are embedded. ``auto``: in the ingress when the Embedder deployment runs a
    local model on the CPU with at most ``MAX_INGRESS_EMBEDDING_PARAMS`` parameters; otherwise in
    the deployment (a remote /v1/embeddings server, a model on a GPU, a large model). An explicit
    ``ingress`` with a remote model is still the deployment: there is no model to load."""
    if setting == "deployment" or remote:
        return "deployment"
    if setting == "ingress":
        return "ingress"
    small = params is not None and params <= MAX_INGRESS_EMBEDDING_PARAMS
    return "ingress" if small and device == "cpu" else "deployment"


class InProcessQueryEmbedder:
    """``TextEmbedder`` (``ragserve.ports``) that encodes queries with ``model`` here.

    Queries go through the query-vector cache first (``TTLCache``, keyed by normalised text, as in
    the Embedder deployment). Misses are encoded on one worker thread, so the event loop stays free
    and two encodes never fight for the same cores. Concurrent queries are micro-batched without
    a timer: a query that finds the encoder idle is encoded at once, alone; those arriving while it
    is busy wait for it and are encoded together in the next call (up to ``max_batch``). A single
    query never waits for company, and under load one model call serves many queries.
    ``on_lookup(hit)`` is told each cache lookup's outcome (the ingress counts them as metrics).
    """

    def __init__(
        self,
        model: LocalEmbeddingModel,
        documents: TextEmbedder,
        *,
        cache_size: int = 10_000,
        cache_ttl_s: float = 24 * 3600.0,
        max_batch: int = 32,
        on_lookup: Callable[[bool], None] | None = None,
    ):
        self.model = model
        self._documents = documents
        self._cache: TTLCache[np.ndarray] = TTLCache(cache_size, cache_ttl_s)
        self._max_batch = max_batch
        self._on_lookup = on_lookup
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="query-embed")
        self._waiting: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        self._busy = False
        self._driver: asyncio.Task[None] | None = None
        self.model_calls = 0

    async def embed_query(self, text: str) -> np.ndarray:
        vec, hit = await self._cache.get_or_compute(normalise_query(text), lambda: self._encode(text))
        if self._on_lookup is not None:
            self._on_lookup(hit)
        return vec

    async def embed_documents(self, texts: list[str], *, bulk: bool = False) -> np.ndarray:
        return await self._documents.embed_documents(texts, bulk=bulk)

    async def count_tokens(
        self, texts: list[str], *, over: int | None = None, total_over: int | None = None
    ) -> list[int]:
        return await self._documents.count_tokens(texts, over=over, total_over=total_over)

    async def _encode(self, text: str) -> np.ndarray:
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._waiting.append((text, future))
        if not self._busy:
            # The encoder is driven by a task of its own, not by this caller: a caller that goes
            # away (a client that left) must not strand the queries waiting behind it.
            self._busy = True
            self._driver = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            await self._drain_waiting()
        finally:
            self._busy = False

    async def _drain_waiting(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            batch, self._waiting = self._waiting[: self._max_batch], self._waiting[self._max_batch :]
            texts = [t for t, _ in batch]
            self.model_calls += 1
            try:
                vecs = await loop.run_in_executor(self._executor, self.model.encode, texts)
            except Exception as e:
                for _, f in batch:
                    if not f.done():
                        f.set_exception(e)
                continue
            for (_, f), vec in zip(batch, vecs, strict=True):
                if not f.done():  # its caller may have gone (a client that left)
                    f.set_result(vec)

    def close(self) -> None:
        self._executor.shutdown(wait=False)

"""Adapters from deployment handles to the protocols the ``ragserve.service`` layer expects.

They translate Ray's wrapped exceptions back into the application's own (``ServiceError``) so
the services never see Ray types.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np
from ray.serve import metrics

from ragserve import tracing
from ragserve.api.generation import GenerationDelta, GenerationResult
from ragserve.api.messages import Message
from ragserve.api.openai import ChatCompletionChunk, ChatCompletionResponse
from ragserve.api.sampling import SamplingParams
from ragserve.deployments.common import log, unwrap_error
from ragserve.deployments.telemetry import CounterBatch
from ragserve.errors import ServiceError
from ragserve.models.tokenizers import counter_for_model
from ragserve.ports import TokenCounter
from ragserve.service.cache import TTLCache, normalise_query


def _reraise(exc: BaseException) -> None:
    inner = unwrap_error(exc)
    if isinstance(inner, ServiceError):
        raise inner from None
    raise exc


def traced(**kwargs: Any) -> dict[str, Any]:
    """``kwargs`` and, with tracing on, ``trace``: the caller's W3C context for the deployment's
    span of the call (docs/architecture.md §7). Off, nothing is added."""
    if tracing.ENABLED:
        kwargs["trace"] = tracing.carrier()
    return kwargs


def query_cache_counters(batch: CounterBatch) -> Callable[[bool], None]:
    """Counts the ingress replica's query-vector cache lookups (hit or miss) as Serve metrics,
    wherever its queries are embedded (``HandleEmbedder``, ``InProcessQueryEmbedder``), summed in
    ``batch``."""
    hits = metrics.Counter(
        "ragserve_ingress_query_cache_hits", "Query embeddings found in the ingress replica's cache."
    )
    misses = metrics.Counter(
        "ragserve_ingress_query_cache_misses", "Query embeddings computed here or asked of the embedder deployment."
    )
    return lambda hit: batch.inc(hits if hit else misses)


class HandleEmbedder:
    """``ragserve.ports.TextEmbedder`` over the Embedder deployment.

    Query vectors are also kept here, in the ingress replica (a first-level cache in front of the
    embedder's shared one): a repeated query then costs no call to another actor, which on a
    small machine is most of a warm retrieval's time."""

    def __init__(
        self,
        handle: Any,
        cache_size: int = 0,
        cache_ttl_s: float = 3600.0,
        on_lookup: Callable[[bool], None] | None = None,
    ):
        self._h = handle
        self._bulk_served = True  # until an older Embedder refuses the keyword
        self._cache: TTLCache[np.ndarray] = TTLCache(cache_size, cache_ttl_s)
        self._on_lookup = on_lookup

    async def embed_documents(self, texts: list[str], *, bulk: bool = False) -> np.ndarray:
        if not bulk or not self._bulk_served:
            return await self._h.embed_documents.remote(texts, **traced())
        try:
            return await self._h.embed_documents.remote(texts, bulk=True, **traced())
        except TypeError as e:  # an Embedder replica from before ``bulk`` (a rolling update): first in line
            if "bulk" not in str(e):
                raise
            self._bulk_served = False
            return await self._h.embed_documents.remote(texts, **traced())

    async def embed_query(self, text: str) -> np.ndarray:
        vec, hit = await self._cache.get_or_compute(
            normalise_query(text), lambda: self._h.embed_query.remote(text, **traced())
        )
        if self._on_lookup is not None:
            self._on_lookup(hit)
        return vec

    async def count_tokens(
        self, texts: list[str], *, over: int | None = None, total_over: int | None = None
    ) -> list[int]:
        return await self._h.count_tokens.remote(texts, over, total_over)


#: How often the ingress asks the Generator again for its prefill speed (which requests may raise:
#: ``TransformersEngine.prefill_tokens_per_s``).
PREFILL_REFRESH_S = 60.0


class HandleGenerator:
    """``ragserve.ports.LanguageModel`` over the Generator deployment. Model id, window and the token
    counter are fetched once and kept, so the budget is computed locally; the prefill speed is asked
    again every ``PREFILL_REFRESH_S``."""

    def __init__(self, handle: Any):
        self._h = handle
        self.model_id = ""
        self._window = 0
        self._prefill: float | None = None
        self._prefill_at = 0.0
        self._counter: TokenCounter | None = None
        self._lock = asyncio.Lock()

    async def ready(self) -> None:
        async with self._lock:
            if self._counter is not None:
                return
            info = await self._h.info.remote()
            self.model_id, self._window = info["model_id"], info["context_window"]
            self._prefill = info.get("prefill_tokens_per_s")  # absent from a generator of an older release
            self._prefill_at = time.monotonic()
            try:
                self._counter = await self._h.token_counter.remote()
            except Exception as e:  # a tokenizer that does not pickle: count here instead
                log.warning("generator token counter not transferable (%s); loading one locally", e)
                self._counter = counter_for_model(self.model_id)

    async def context_window(self) -> int:
        await self.ready()
        return self._window

    async def token_counter(self) -> TokenCounter:
        await self.ready()
        assert self._counter is not None
        return self._counter

    async def prefill_tokens_per_s(self) -> float | None:
        await self.ready()
        if time.monotonic() - self._prefill_at >= PREFILL_REFRESH_S:
            self._prefill_at = time.monotonic()  # one refresh at a time; a failed one waits its turn too
            try:
                self._prefill = (await self._h.info.remote()).get("prefill_tokens_per_s", self._prefill)
            except Exception as e:
                log.warning("generator info not refreshed (%s); prefill speed kept at %s", e, self._prefill)
        return self._prefill

    async def chat(self, messages: Sequence[Message], params: SamplingParams) -> GenerationResult:
        try:
            return await self._h.chat.remote(list(messages), params, **traced())
        except Exception as e:
            _reraise(e)
            raise

    async def chat_stream(self, messages: Sequence[Message], params: SamplingParams) -> AsyncIterator[GenerationDelta]:
        try:
            async for delta in self._h.options(stream=True).chat_stream.remote(list(messages), params, **traced()):
                yield delta
        except Exception as e:
            _reraise(e)
            raise

    async def passthrough(self, body: dict[str, Any], default_max_tokens: int) -> ChatCompletionResponse:
        try:
            return await self._h.passthrough.remote(body, default_max_tokens, **traced())
        except Exception as e:
            _reraise(e)
            raise

    async def passthrough_stream(
        self, body: dict[str, Any], default_max_tokens: int
    ) -> AsyncIterator[ChatCompletionChunk]:
        try:
            async for chunk in self._h.options(stream=True).passthrough_stream.remote(
                body, default_max_tokens, **traced()
            ):
                yield chunk
        except Exception as e:
            _reraise(e)
            raise

"""Generator deployment: one ``GenerationEngine`` (transformers | vllm | openai) behind handles.

The ingress asks it once for the model id, the context window, the prefill speed and the token
counter (pickled to the ingress, so budgeting never costs a remote call), then calls chat / chat_stream / passthrough.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ray import serve
from ray.serve import metrics

from ragserve import heap, tracing
from ragserve.api.generation import GenerationDelta, GenerationResult
from ragserve.api.messages import Message
from ragserve.api.openai import ChatCompletionChunk, ChatCompletionResponse
from ragserve.api.sampling import SamplingParams
from ragserve.config import Settings
from ragserve.deployments.common import as_settings, log
from ragserve.ports import TokenCounter
from ragserve.service.engine_factory import make_engine
from ragserve.service.local import EngineClient


@serve.deployment(name="Generator", max_ongoing_requests=32, ray_actor_options={"num_cpus": 1})
class Generator:
    async def __init__(self, settings: Settings | dict[str, Any] | None = None):  # type: ignore[misc]  # Serve awaits async constructors
        tracing.configure("generator")  # on when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set
        self.settings = as_settings(settings)
        self.engine = make_engine(self.settings)
        client = EngineClient(self.engine, self.settings.context_window)
        t0 = time.perf_counter()
        await client.start()
        self.window = await client.context_window()
        self._latency = metrics.Histogram(
            "ragserve_generation_latency_ms",
            "Time to generate a whole completion.",
            boundaries=[50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000],
            tag_keys=("kind",),
        )
        log.info(
            "generator ready: engine=%s model=%s window=%d prefill=%s tokens/s in %.1fs",
            self.settings.llm_engine,
            self.engine.model_id,
            self.window,
            self.engine.prefill_tokens_per_s(),
            time.perf_counter() - t0,
        )
        heap.settle("generator")

    def info(self) -> dict[str, Any]:
        return {
            "model_id": self.engine.model_id,
            "context_window": self.window,
            "engine": self.settings.llm_engine,
            "prefill_tokens_per_s": self.engine.prefill_tokens_per_s(),
        }

    def token_counter(self) -> TokenCounter:
        return self.engine.token_counter()

    # ``trace``: the caller's W3C context (``HandleGenerator``); each call is a span of this replica,
    # its child, under which the engine's own (a remote upstream's client span) open
    # (docs/architecture.md §7).
    async def chat(
        self, messages: list[Message], params: SamplingParams, trace: Mapping[str, str] | None = None
    ) -> GenerationResult:
        t0 = time.perf_counter()
        try:
            with tracing.remote_span("generator.chat", trace, self._span_attributes()):
                return await self.engine.chat(messages, params)
        finally:
            self._latency.observe((time.perf_counter() - t0) * 1000, tags={"kind": "chat"})

    async def chat_stream(
        self, messages: list[Message], params: SamplingParams, trace: Mapping[str, str] | None = None
    ) -> AsyncIterator[GenerationDelta]:
        async for delta in self._traced_stream(
            "generator.chat_stream", trace, self.engine.chat_stream(messages, params)
        ):
            yield delta

    async def passthrough(
        self, body: dict[str, Any], default_max_tokens: int, trace: Mapping[str, str] | None = None
    ) -> ChatCompletionResponse:
        t0 = time.perf_counter()
        try:
            with tracing.remote_span("generator.passthrough", trace, self._span_attributes()):
                return await self.engine.passthrough(body, default_max_tokens)
        finally:
            self._latency.observe((time.perf_counter() - t0) * 1000, tags={"kind": "passthrough"})

    async def passthrough_stream(
        self, body: dict[str, Any], default_max_tokens: int, trace: Mapping[str, str] | None = None
    ) -> AsyncIterator[ChatCompletionChunk]:
        stream = self.engine.passthrough_stream(body, default_max_tokens)
        async for chunk in self._traced_stream("generator.passthrough_stream", trace, stream):
            yield chunk

    def _span_attributes(self) -> dict[str, Any] | None:
        if not tracing.ENABLED:
            return None
        return {"ragserve.llm_engine": self.settings.llm_engine, "gen_ai.request.model": self.engine.model_id}

    async def _traced_stream(self, name: str, trace: Mapping[str, str] | None, items: AsyncIterator[Any]) -> Any:
        """``items`` relayed; with tracing on, in a span (current only while an item is awaited)
        that ends with the stream."""
        if not tracing.ENABLED:
            async for item in items:
                yield item
            return
        span = tracing.start(name, self._span_attributes(), parent=tracing.extract(trace))
        try:
            async for item in tracing.within(span, items):
                yield item
        except BaseException as e:
            tracing.failed(span, e)
            raise
        finally:
            span.end()

    async def check_health(self) -> None:
        """Serve calls this periodically; a failing engine gets the replica restarted."""
        await self.engine.check_health()

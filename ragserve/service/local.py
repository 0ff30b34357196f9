"""An engine in this process as the chat pipeline's ``LanguageModel`` (no Ray): the remote engine
inside the ingress, tests, and single-process use."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from ragserve.api.generation import GenerationDelta, GenerationResult
from ragserve.api.messages import Message
from ragserve.api.openai import ChatCompletionChunk, ChatCompletionResponse
from ragserve.api.sampling import SamplingParams
from ragserve.models.engine import GenerationEngine
from ragserve.models.windows import resolve_context_window
from ragserve.ports import TokenCounter


class EngineClient:
    """``ragserve.ports.LanguageModel`` over an engine in this process; call ``start`` first."""

    def __init__(self, engine: GenerationEngine, configured_window: int | None = None):
        self.engine = engine
        self._configured = configured_window
        self._window: int | None = None

    async def start(self) -> None:
        await self.engine.start()
        self._window = resolve_context_window(
            configured=self._configured, engine=self.engine.context_window(), model=self.engine.model_id
        )

    @property
    def model_id(self) -> str:
        return self.engine.model_id

    async def context_window(self) -> int:
        if self._window is None:
            await self.start()
        assert self._window is not None
        return self._window

    async def token_counter(self) -> TokenCounter:
        return self.engine.token_counter()

    async def prefill_tokens_per_s(self) -> float | None:
        if self._window is None:
            await self.start()
        return self.engine.prefill_tokens_per_s()

    async def chat(self, messages: Sequence[Message], params: SamplingParams) -> GenerationResult:
        return await self.engine.chat(messages, params)

    def chat_stream(self, messages: Sequence[Message], params: SamplingParams) -> AsyncIterator[GenerationDelta]:
        return self.engine.chat_stream(messages, params)

    async def passthrough(self, body: dict[str, Any], default_max_tokens: int) -> ChatCompletionResponse:
        return await self.engine.passthrough(body, default_max_tokens)

    def passthrough_stream(self, body: dict[str, Any], default_max_tokens: int) -> AsyncIterator[ChatCompletionChunk]:
        return self.engine.passthrough_stream(body, default_max_tokens)

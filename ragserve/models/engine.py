"""The generation-engine interface every backend implements (transformers, vLLM, remote OpenAI).

The generator deployment is a thin shell over one of these; the ingress never knows which. What
all engines share lives here, as defaults a backend may override (Ray Serve LLM's engine base works
the same way): the health check, capping a configured window by the served one, refusing what a
plain-text engine cannot serve, the prompt-length check, usage accounting, and passthrough served
as a plain chat. A backend implements ``token_counter`` and ``chat_stream``; no backend imports
another (docs/architecture.md §9).
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from ragserve.api.generation import GenerationDelta, GenerationResult
from ragserve.api.messages import Message
from ragserve.api.openai import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionResponse,
    DeltaMessage,
    ResponseMessage,
)
from ragserve.api.sampling import SamplingParams
from ragserve.errors import BadRequestError, EngineError
from ragserve.ports import TokenCounter

__all__ = ["EngineError", "GenerationDelta", "GenerationEngine", "GenerationResult", "SamplingParams", "collect"]

log = logging.getLogger(__name__)


def cap_window(configured: int | None, served: Any, model: str) -> int | None:
    """The configured window, but never more than the served model's own (``max_model_len``): a
    longer prompt would only be rejected by the model after the budget let it through."""
    served = served if isinstance(served, int) and served > 0 else None
    if configured is None or served is None:
        return configured or served
    if configured > served:
        log.warning(
            "context_window %d is larger than max_model_len %d of %s; using %d", configured, served, model, served
        )
    return min(configured, served)


class GenerationEngine(abc.ABC):
    """One LLM backend. ``start`` loads the model (or checks the upstream); the rest serves."""

    model_id: str
    #: Whether passthrough may carry tools, function calls and non-text content. Engines that render
    #: chats as plain text have no tool-call parser, so such a request would silently lose part of
    #: itself; they refuse it with a 400 instead. A remote server decides for itself.
    serves_rich_requests: bool = False
    #: Shown in messages ("not supported by the embedded transformers engine").
    engine_name: str = "local"
    _window: int | None = None

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load weights or probe the upstream; called once before serving."""

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Release resources (HTTP clients, engine loops)."""

    async def check_health(self) -> None:  # noqa: B027 - optional hook
        """Raise if the engine cannot serve, so Serve restarts the replica. The default has nothing
        to check: a failure then shows per request, and a restart would not help."""

    def context_window(self) -> int | None:
        """The window the engine itself knows (vLLM max_model_len, the model config), or None."""
        return self._window

    def prefill_tokens_per_s(self) -> float | None:
        """Prompt tokens per second this engine reads on this machine, where that bounds the context a
        request can afford (the embedded CPU engine measures it at start); None where it does not (a
        GPU or a remote server: the window does). See ``ragserve.rag.context_size``."""
        return None

    def set_window(self, configured: int | None, served: Any) -> None:
        """Remember the window: the configured one, capped by what the model serves."""
        self._window = cap_window(configured, served, self.model_id)

    @abc.abstractmethod
    def token_counter(self) -> TokenCounter:
        """A counter that counts prompts as this engine will render them."""

    @abc.abstractmethod
    def chat_stream(self, messages: Sequence[Message], params: SamplingParams) -> AsyncGenerator[GenerationDelta, None]:
        """Deltas as they are produced; the last one carries ``finish_reason`` and the usage. Closing
        the iterator early must stop generation."""

    async def chat(self, messages: Sequence[Message], params: SamplingParams) -> GenerationResult:
        """A whole completion: by default the stream, drained."""
        return await collect(self.chat_stream(messages, params))

    def check_prompt_fits(self, prompt_tokens: int) -> None:
        """A prompt that leaves no room for a single token is the client's to shorten (400)."""
        window = self.context_window()
        if window is not None and prompt_tokens >= window:
            raise BadRequestError(
                f"Prompt length exceeds context window: the prompt has {prompt_tokens} tokens, the window {window}",
                param="messages",
                code="context_length_exceeded",
            )

    def check_sampling(self, params: SamplingParams) -> None:
        """Refuse (400) sampling fields this engine cannot honour, rather than ignore them."""
        if params.extra and not self.serves_rich_requests:
            names = ", ".join(sorted(params.extra))
            raise BadRequestError(
                f"{names}: not supported by the embedded {self.engine_name} engine; remove "
                f"{'it' if len(params.extra) == 1 else 'them'} or use a remote OpenAI-compatible "
                "server (llm_engine: openai)",
                param=sorted(params.extra)[0],
            )

    def check_passthrough(self, body: dict[str, Any]) -> None:
        """Refuse (400) what this engine cannot serve; see :attr:`serves_rich_requests`."""
        if self.serves_rich_requests:
            return
        for key in ("tools", "functions"):
            if body.get(key):
                raise BadRequestError(
                    f"'{key}' (tool and function calling) is not supported by the embedded {self.engine_name} engine",
                    param=key,
                )
        for i, message in enumerate(body.get("messages") or []):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                for part in content:
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    if kind != "text":
                        raise BadRequestError(
                            f"messages[{i}]: content of type {kind!r} is not supported by the "
                            f"embedded {self.engine_name} engine (text only)",
                            param=f"messages[{i}].content",
                        )

    async def passthrough(self, body: dict[str, Any], default_max_tokens: int) -> ChatCompletionResponse:
        """Answer a raw OpenAI chat body (no RAG fields; a ``max_tokens`` it has is already clamped to
        the window, ``default_max_tokens`` applies where it has none). Local engines serve the text of
        its messages; a remote engine forwards the body as it is."""
        self.check_passthrough(body)
        result = await self.chat(body["messages"], SamplingParams.from_body(body, default_max_tokens))
        return ChatCompletionResponse(
            model=self.model_id,
            choices=[
                ChatCompletionChoice(
                    index=0,
                    message=ResponseMessage(role="assistant", content=result.text),
                    finish_reason=result.finish_reason,
                )
            ],
            usage=result.usage(),
        )

    async def passthrough_stream(
        self, body: dict[str, Any], default_max_tokens: int
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """Streamed passthrough: chunks without id/created, which the chat service sets."""
        self.check_passthrough(body)
        params = SamplingParams.from_body(body, default_max_tokens)
        async with contextlib.aclosing(self.chat_stream(body["messages"], params)) as deltas:
            async for delta in deltas:
                chunk = ChatCompletionChunk(
                    model=self.model_id,
                    choices=[
                        ChatCompletionChunkChoice(
                            index=0,
                            delta=DeltaMessage(content=delta.text) if delta.text else DeltaMessage(),
                            finish_reason=delta.finish_reason,
                        )
                    ],
                )
                usage = delta.usage()
                if usage is not None:
                    chunk.usage = usage
                yield chunk


async def collect(deltas: AsyncGenerator[GenerationDelta, None]) -> GenerationResult:
    """A whole result from a stream of deltas. The stream is closed even if this is cancelled, so
    generation stops with it."""
    parts: list[str] = []
    last = GenerationDelta()
    model = None
    async with contextlib.aclosing(deltas):
        async for delta in deltas:
            parts.append(delta.text)
            last = delta
            model = model or delta.model
    return GenerationResult(
        text="".join(parts),
        finish_reason=last.finish_reason or "stop",
        prompt_tokens=last.prompt_tokens or 0,
        completion_tokens=last.completion_tokens or 0,
        model=model,
    )

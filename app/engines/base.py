"""The generation-engine interface every backend implements (transformers, vLLM, remote OpenAI).

The generator deployment is a thin shell over one of these; the ingress never knows which.
Messages are OpenAI-style dicts; results are engine-neutral, and the ingress renders them into
the OpenAI wire format.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from app.api.openai import SamplingParams
from app.budget.tokenizers import Message, TokenCounter


@dataclass
class GenerationResult:
    text: str
    finish_reason: str = "stop"  # "stop" | "length"
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class GenerationDelta:
    """One streamed piece: text (possibly empty) and, on the last one, the finish reason and usage."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class EngineError(Exception):
    """An engine or upstream failure that the client should see with this status and message."""

    def __init__(self, status: int, message: str, *, type_: str = "upstream_error", body: Any = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.body = body

    def __reduce__(self) -> tuple[Any, ...]:
        # exceptions cross process boundaries (Ray handles) by pickling; keep every field
        return (_rebuild_engine_error, (self.status, self.message, self.type, self.body))


def _rebuild_engine_error(status: int, message: str, type_: str, body: Any) -> EngineError:
    return EngineError(status, message, type_=type_, body=body)


class GenerationEngine(abc.ABC):
    """One LLM backend. ``start`` loads the model (or checks the upstream); the rest serves."""

    model_id: str

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load weights or probe the upstream; called once before serving."""

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Release resources (HTTP clients, engine loops)."""

    @abc.abstractmethod
    def context_window(self) -> int | None:
        """The window the engine itself knows (vLLM max_model_len, model config), or None."""

    @abc.abstractmethod
    def token_counter(self) -> TokenCounter:
        """A counter that counts prompts as this engine will render them."""

    @abc.abstractmethod
    async def chat(self, messages: Sequence[Message], params: SamplingParams) -> GenerationResult:
        """A whole completion."""

    @abc.abstractmethod
    def chat_stream(self, messages: Sequence[Message], params: SamplingParams) -> AsyncIterator[GenerationDelta]:
        """Deltas as they are produced; the last one carries ``finish_reason``."""

    async def passthrough(self, body: dict[str, Any]) -> dict[str, Any]:
        """Forward a raw OpenAI chat body (no RAG fields, ``max_tokens`` already clamped) and return
        the OpenAI response body. Local engines serve the text of the messages; remote engines
        forward the body as it is."""
        params = sampling_params_from_body(body)
        result = await self.chat(body["messages"], params)
        return {
            "model": self.model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                         "finish_reason": result.finish_reason}],
            "usage": {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
                      "total_tokens": result.prompt_tokens + result.completion_tokens},
        }

    async def passthrough_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Streamed passthrough: yields OpenAI ``chat.completion.chunk`` bodies (without id/created,
        which the ingress sets)."""
        params = sampling_params_from_body(body)
        async for delta in self.chat_stream(body["messages"], params):
            chunk: dict[str, Any] = {
                "model": self.model_id,
                "choices": [{"index": 0, "delta": {"content": delta.text} if delta.text else {},
                             "finish_reason": delta.finish_reason}],
            }
            if delta.prompt_tokens is not None:
                chunk["usage"] = {"prompt_tokens": delta.prompt_tokens,
                                  "completion_tokens": delta.completion_tokens or 0,
                                  "total_tokens": delta.prompt_tokens + (delta.completion_tokens or 0)}
            yield chunk


async def collect(deltas: AsyncIterator[GenerationDelta]) -> GenerationResult:
    """A whole result from a stream of deltas (engines whose chat() is their stream, drained).
    The stream is closed even if this is cancelled, so generation stops with it."""
    parts: list[str] = []
    last = GenerationDelta()
    try:
        async for delta in deltas:
            parts.append(delta.text)
            last = delta
    finally:
        await deltas.aclose()  # type: ignore[attr-defined]
    return GenerationResult(text="".join(parts), finish_reason=last.finish_reason or "stop",
                            prompt_tokens=last.prompt_tokens or 0, completion_tokens=last.completion_tokens or 0)


def sampling_params_from_body(body: dict[str, Any]) -> SamplingParams:
    """Engine-neutral sampling parameters from an OpenAI body whose max_tokens is already set."""
    stop = body.get("stop")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if not max_tokens:
        raise ValueError("max_tokens must be set before the body reaches an engine")
    return SamplingParams(
        max_tokens=int(max_tokens),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        stop=[stop] if isinstance(stop, str) else list(stop or []),
        seed=body.get("seed"),
    )

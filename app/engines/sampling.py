"""The sampling parameters an engine needs, engine-side and wire-neutral.

Requests build them (``ChatCompletionRequest.to_sampling_params``, ``LLMParams.to_sampling_params``)
after the token budget has fixed ``max_tokens``; each engine maps them onto its own API (an upstream
body, vLLM's ``SamplingParams``, transformers' ``generate`` arguments). Keeping them out of the wire
models means an engine never sees a field it was not designed for. A leaf module, so both the API
models and the engines can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """``max_tokens`` is the completion budget already fitted into the window."""

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] | list[str] = field(default_factory=tuple)
    seed: int | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> SamplingParams:
        """From an OpenAI chat body whose ``max_tokens`` (or ``max_completion_tokens``) is already set
        (passthrough on a local engine, which serves the body's messages as a plain chat)."""
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if not max_tokens:
            raise ValueError("max_tokens must be set before the body reaches an engine")
        stop = body.get("stop")
        return cls(max_tokens=int(max_tokens), temperature=body.get("temperature"), top_p=body.get("top_p"),
                   stop=(stop,) if isinstance(stop, str) else tuple(stop or ()), seed=body.get("seed"))

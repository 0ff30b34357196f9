"""What a language model returns: a whole completion (``GenerationResult``) or one streamed piece
(``GenerationDelta``), with the token usage the engine counted. They cross the boundary between the
Generator deployment and the ingress, so they live with the other wire shapes."""

from __future__ import annotations

from dataclasses import dataclass

from ragserve.api.openai import UsageInfo


@dataclass
class GenerationResult:
    text: str
    finish_reason: str = "stop"  # "stop" | "length"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str | None = None  # the model that generated it, where the engine knows (a remote server)

    def usage(self) -> UsageInfo:
        return UsageInfo.of(self.prompt_tokens, self.completion_tokens)


@dataclass
class GenerationDelta:
    """One streamed piece: text (possibly empty) and, on the last one, the finish reason and usage."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model: str | None = None

    def usage(self) -> UsageInfo | None:
        if self.prompt_tokens is None:
            return None
        return UsageInfo.of(self.prompt_tokens, self.completion_tokens or 0)

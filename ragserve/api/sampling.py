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

#: Chat fields whose value sampling does not depend on: the body's own, the budget's, tool calling
#: (refused or forwarded whole) and the typed ones below. RAG-only fields never get here (the
#: upstream body has them removed). Every other field a client sends is ``extra``.
NOT_EXTRA = frozenset(
    {
        "messages",
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "user",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
    }
)


#: Stop sequences a request may send (OpenAI's four), and characters in each: a local engine checks
#: the unsent tail of its answer against every stop after every token, and a stop no longer than
#: this keeps that check a fraction of a millisecond whatever the answer (four stops of 100,000
#: characters cost seconds over a few thousand tokens of spaces a stripped answer holds back).
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256


def check_stop(stop: str | list[str] | None) -> str | list[str] | None:
    """``stop`` as a request sent it, or ``ValueError`` saying what is accepted (a pydantic
    validator: the message names the field)."""
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if len(stops) > MAX_STOP_SEQUENCES:
        raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stops)}")
    for i, s in enumerate(stops):
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(f"stop sequence {i} has {len(s)} characters; each may have at most {MAX_STOP_CHARS}")
    return stop


def extra_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of an OpenAI chat body beyond the typed sampling parameters (``response_format``,
    penalties, ``logprobs``, ``logit_bias``, a server's own such as ``repetition_penalty``), without
    those that ask for nothing (``null``, ``n: 1``, ``logprobs: false``)."""
    out = {}
    for key, value in body.items():
        if key in NOT_EXTRA or value is None or (key == "n" and value == 1) or (key == "logprobs" and value is False):
            continue
        out[key] = value
    return out


@dataclass(frozen=True)
class SamplingParams:
    """``max_tokens`` is the completion budget already fitted into the window."""

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] | list[str] = field(default_factory=tuple)
    seed: int | None = None
    #: The model the client asked for: a remote server is asked for it, a local engine serves its own.
    model: str | None = None
    #: Further OpenAI fields (see :func:`extra_fields`): a remote server gets them as they are; an
    #: engine that cannot honour them refuses the request rather than drop them.
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The last user turn is a question to answer from sources that the system messages carry (the
    #: chat service sets it when it built a RAG prompt with sources in it). Not an OpenAI field and
    #: never sent upstream: it tells a plain-text prompt format how to end the prompt (``Question:``
    #: / ``Answer:`` rather than ``User:`` / ``Assistant:``), so an engine need not search the
    #: system text for the RAG prompt's layout. Chat templates and remote servers ignore it.
    grounded: bool = False

    def set_fields(self) -> dict[str, Any]:
        """The typed sampling fields the request set, by their OpenAI names (what an engine passes on)."""
        fields: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": list(self.stop) or None,
            "seed": self.seed,
        }
        return {k: v for k, v in fields.items() if v is not None}

    @classmethod
    def from_body(cls, body: Mapping[str, Any], default_max_tokens: int) -> SamplingParams:
        """From an OpenAI chat body (passthrough on a local engine, which serves the body's messages
        as a plain chat, never ``grounded``); ``default_max_tokens`` when the body sets no limit."""
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
        stop = body.get("stop")
        return cls(
            max_tokens=int(max_tokens),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
            seed=body.get("seed"),
            model=body.get("model"),
            extra=extra_fields(body),
        )

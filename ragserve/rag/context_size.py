"""How much context a chat request without ``top_k`` gets (docs/architecture.md §5).

The window says how much a prompt may hold; what a model can *use* also depends on what a prompt
costs it. A GPU or a remote server reads a long prompt in a moment, so the context gets its share of
the window (``context_token_ratio``), as before. The embedded CPU engine reads a few hundred tokens a
second: a window's share of sources (tens of sources, thousands of tokens) would take minutes to
answer, and a small model answers worse from them than from a few. So an engine that reports its
prefill speed gets the sources it reads in ``chat_context_prefill_s`` (never more than half of
``llm_timeout_s``, and never less than ``MIN_CONTEXT_SOURCES`` chunks), and ``chat_context_tokens``, when set,
fixes the size outright. A request's own ``top_k`` is not sized here: it gets what it asks for, within
the window.

Pure: numbers in, numbers out; the chat service asks the model for its window and speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

#: Candidates retrieved for a chat without ``top_k`` are never fewer: ``fit`` takes the best that
#: fit, and a long one it must skip leaves others to try.
MIN_CANDIDATES = 5
#: The least context an engine's speed may leave, in chunks of ``chunk_size``: the source that answers
#: a question is most often among the first three retrieved (11 of 12 questions on issue 23's set),
#: and a speed measured while the machine was busy must not leave it out.
MIN_CONTEXT_SOURCES = 3

ContextBasis = Literal["setting", "engine_speed", "window"]


@dataclass(frozen=True)
class ContextSize:
    """The context a chat request without ``top_k`` gets.

    ``tokens``: what its sources may take (``fit`` never selects more; when ``basis`` is ``window``
    the window's share is the only limit). ``top_k``: the candidates retrieved for it. ``basis``:
    which limit set ``tokens``: ``setting`` (``chat_context_tokens``), ``engine_speed`` (what the
    engine prefills in ``prefill_s`` seconds at ``prefill_tokens_per_s``), or ``window`` (the
    ``context_token_ratio`` share of what the window leaves after the completion, ``window_share``).
    """

    tokens: int
    top_k: int
    basis: ContextBasis
    window_share: int
    prefill_tokens_per_s: float | None = None
    prefill_s: float | None = None

    @property
    def cap(self) -> int | None:
        """The bound to put on ``fit``'s context share; None when the window's share is the bound."""
        return None if self.basis == "window" else self.tokens

    def describe(self, chunk_size: int) -> str:
        """One line for people: the size, about how many sources of ``chunk_size`` tokens it holds,
        and why."""
        sources = max(1, self.tokens // chunk_size)
        if self.basis == "setting":
            why = "chat_context_tokens"
        elif self.basis == "engine_speed":
            rate, seconds = self.prefill_tokens_per_s or 0.0, self.prefill_s or 0.0
            why = f"what the engine prefills in {seconds:g} s at {rate:.0f} tokens/s"
            if rate * seconds < self.tokens:  # the floor
                read = rate * seconds
                why = f"the least, {MIN_CONTEXT_SOURCES} chunks: the engine prefills {read:.0f} tokens in {seconds:g} s"
        else:
            why = "context_token_ratio of the window"
        return f"{self.tokens} tokens, about {sources} source(s) of {chunk_size} tokens ({why})"


def chat_context_size(
    *,
    window: int,
    reserve: int,
    ratio: float,
    chunk_size: int,
    max_top_k: int,
    configured_tokens: int | None = None,
    prefill_tokens_per_s: float | None = None,
    prefill_s: float = 2.0,
    timeout_s: float | None = None,
) -> ContextSize:
    """The context of a chat request without ``top_k``.

    ``window``: the model's window; ``reserve``: the completion's tokens (the request's
    ``max_tokens`` or the default); ``ratio``: ``context_token_ratio``; ``configured_tokens``:
    ``chat_context_tokens`` (None: sized by the engine); ``prefill_tokens_per_s``: the engine's
    prefill speed, None where its cost does not bound the context (GPU, remote); ``prefill_s``:
    ``chat_context_prefill_s``; ``timeout_s``: ``llm_timeout_s``. The size never exceeds the window's
    share; candidates are about the size divided by ``chunk_size``, at least ``MIN_CANDIDATES`` and at
    most ``max_top_k``.
    """
    share = math.floor(max(0, window - reserve) * ratio)
    tokens = share
    basis: ContextBasis = "window"
    seconds: float | None = None
    if configured_tokens is not None:
        if configured_tokens < share:
            tokens, basis = configured_tokens, "setting"
    elif prefill_tokens_per_s is not None and prefill_tokens_per_s > 0:
        seconds = prefill_s if timeout_s is None else min(prefill_s, timeout_s / 2)
        affordable = max(MIN_CONTEXT_SOURCES * chunk_size, math.floor(prefill_tokens_per_s * seconds))
        if affordable < share:
            tokens, basis = affordable, "engine_speed"
    top_k = min(max_top_k, max(MIN_CANDIDATES, tokens // chunk_size))
    return ContextSize(
        tokens=tokens,
        top_k=top_k,
        basis=basis,
        window_share=share,
        prefill_tokens_per_s=prefill_tokens_per_s,
        prefill_s=seconds,
    )

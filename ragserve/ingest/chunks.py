"""The chunk type and errors shared by the chunkers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TokenCount = Callable[[str], int]


@dataclass(frozen=True)
class Chunk:
    """A piece of a document: ``text == source[start_char:end_char]``."""

    text: str
    index: int
    start_char: int
    end_char: int


class ChunkingError(ValueError):
    """A client mistake in how a document asks to be chunked (shown as a 400)."""


#: Texts per call of the Rust tokenizer in ``many``: one call holds the GIL (so the event loop) for
#: as long as it builds its results, about 5 ms per 1000 small texts.
_BATCH = 1000
#: ... and at most about this many characters: a call keeps every text's encoding (ids, offsets,
#: token strings) until it returns, so a batch of long texts (a megabyte of CJK, about one token a
#: character) would hold tens of megabytes at once. A text longer than this goes alone.
_BATCH_CHARS = 64_000


class _HFTokenCount:
    """Token counts with a Hugging Face tokenizer (see ``hf_token_counter``); ``many`` counts a list
    in one call of the Rust tokenizer, when there is one (a chunker counting thousands of small
    code segments paid about 0.1 ms of Python per call)."""

    def __init__(self, tokenizer: Any):
        self._own = copy.deepcopy(tokenizer)
        self._backend = getattr(self._own, "backend_tokenizer", None)
        if self._backend is not None:  # this copy is ours alone: counts are never cut or padded
            self._backend.no_truncation()
            self._backend.no_padding()

    def __call__(self, text: str) -> int:
        if not text:
            return 0
        if self._backend is not None:
            # one count is a batch of one: the Rust tokenizer itself (transformers' encode adds ~45 µs
            # a call) through ``encode_batch``, which lets the GIL go while it tokenizes, where
            # ``Tokenizer.encode`` holds it for the whole count (1.4 s of a stopped event loop for 1.2 MB)
            return self.many([text])[0]
        return len(self._own.encode(text, add_special_tokens=False))

    def many(self, texts: list[str]) -> list[int]:
        if self._backend is None:
            return [self(t) for t in texts]
        counts: list[int] = []
        start = 0
        while start < len(texts):  # a call holds the GIL while it builds its results
            end, chars = start + 1, len(texts[start])
            while end < len(texts) and end - start < _BATCH and chars + len(texts[end]) <= _BATCH_CHARS:
                chars += len(texts[end])
                end += 1
            counts.extend(len(e) for e in self._backend.encode_batch(texts[start:end], add_special_tokens=False))
            start = end
        return counts


def hf_token_counter(tokenizer: Any) -> TokenCount:
    """Token count with a Hugging Face tokenizer (the embedding model's), without special tokens.

    It counts with a copy of ``tokenizer``: the caller's may be the one a model encodes with (the
    ingress's query model), and a fast tokenizer that this count reconfigures (no padding, no
    truncation) while another thread encodes with it fails that encode ("Unable to create
    tensor"). ``LocalEmbeddingModel`` locks its own uses; chunking, on worker threads, cannot
    take that lock, so it gets an object of its own."""
    return _HFTokenCount(tokenizer)


def count_each(count: TokenCount, texts: list[str]) -> list[int]:
    """The token count of each of ``texts``: in one batch when ``count`` has one (``many``)."""
    many = getattr(count, "many", None)
    return list(many(texts)) if many is not None else [count(t) for t in texts]


def number(chunks: list[tuple[int, int]], text: str) -> list[Chunk]:
    """Spans → numbered chunks, trimmed of surrounding whitespace, empty ones dropped."""
    out: list[Chunk] = []
    for start, end in chunks:
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if end > start:
            out.append(Chunk(text=text[start:end], index=len(out), start_char=start, end_char=end))
    return out

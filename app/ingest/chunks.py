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


def hf_token_counter(tokenizer: Any) -> TokenCount:
    """Token count with a Hugging Face tokenizer (the embedding model's), without special tokens.

    It counts with a copy of ``tokenizer``: the caller's may be the one a model encodes with (the
    ingress's query model), and a fast tokenizer that this count reconfigures (no padding, no
    truncation) while another thread encodes with it fails that encode ("Unable to create
    tensor"). ``LocalEmbeddingModel`` locks its own uses; chunking, on worker threads, cannot
    take that lock, so it gets an object of its own."""
    own = copy.deepcopy(tokenizer)

    def count(text: str) -> int:
        return len(own.encode(text, add_special_tokens=False)) if text else 0

    return count


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

"""Per-document choice of splitter (KAITO's convention): ``metadata.split_type == "code"`` with
``metadata.language`` selects code-aware splitting; anything else is split into sentences."""

from __future__ import annotations

import re
from typing import Any

from ragserve.ingest.chunks import Chunk, TokenCount
from ragserve.ingest.code import CodeChunker
from ragserve.ingest.sentence import SentenceChunker

#: A character a reader sees: not whitespace, a control character or an invisible format character
#: (zero-width spaces and joiners, direction marks, the BOM, tag characters). Text without one has
#: nothing to index, like text of spaces only (one character class: a linear search).
_VISIBLE = re.compile(
    "[^\\s\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]"
)


def has_visible_text(text: str) -> bool:
    """Whether ``text`` holds a character a reader sees (``_VISIBLE``)."""
    return _VISIBLE.search(text) is not None


class DocumentChunker:
    def __init__(self, count_tokens: TokenCount, chunk_size: int = 256, chunk_overlap: int = 32):
        self.count_tokens = count_tokens
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.sentences = SentenceChunker(count_tokens, chunk_size, chunk_overlap)
        self.code = CodeChunker(count_tokens, chunk_size, chunk_overlap)

    def resized(self, chunk_size: int, chunk_overlap: int) -> DocumentChunker:
        """A chunker counting the same tokens with other sizes (a vector store file's static
        ``chunking_strategy``); this one when they are its own."""
        if (chunk_size, chunk_overlap) == (self.chunk_size, self.chunk_overlap):
            return self
        return DocumentChunker(self.count_tokens, chunk_size, chunk_overlap)

    def chunk(self, text: str, metadata: dict[str, Any] | None) -> list[Chunk]:
        meta = metadata or {}
        if not has_visible_text(text):
            return []
        if meta.get("split_type") == "code":
            return self.code.split(text, str(meta.get("language") or ""))
        return self.sentences.split(text)

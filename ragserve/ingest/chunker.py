"""Per-document choice of splitter (KAITO's convention): ``metadata.split_type == "code"`` with
``metadata.language`` selects code-aware splitting; anything else is split into sentences."""

from __future__ import annotations

from typing import Any

from ragserve.ingest.chunks import Chunk, TokenCount
from ragserve.ingest.code import CodeChunker
from ragserve.ingest.sentence import SentenceChunker


class DocumentChunker:
    def __init__(self, count_tokens: TokenCount, chunk_size: int = 256, chunk_overlap: int = 32):
        self.sentences = SentenceChunker(count_tokens, chunk_size, chunk_overlap)
        self.code = CodeChunker(count_tokens, chunk_size, chunk_overlap)

    def chunk(self, text: str, metadata: dict[str, Any] | None) -> list[Chunk]:
        meta = metadata or {}
        if meta.get("split_type") == "code":
            return self.code.split(text, str(meta.get("language") or ""))
        return self.sentences.split(text)
